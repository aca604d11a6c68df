package pushlb_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// TestFollowRequested: a client that follows on request mirrors and
// routes the services it is configured with, follows another at its first
// request (routed by that request, with its full list), answers a service
// nobody registered unknown (and remembers it), and keeps nothing of a
// flood of invented names.
func TestFollowRequested(t *testing.T) {
	srv := natstest.Start(t)
	announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	announce(t, srv, "billing", "", testpub.Backend(t, "b"))
	for i := range 3 {
		announce(t, srv, fmt.Sprintf("other-%d", i), "", testpub.Backend(t, "x"))
	}
	c := startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowRequested, Services: []string{"billing"}})
	client := &http.Client{Transport: c.Transport()}

	if got := c.Services(); !slices.Equal(got, []string{"billing"}) {
		t.Fatalf("services at start = %v, want the configured one only", got)
	}
	if st := c.Stats(); st.Registry.Instances != 1 || st.Follow.Mode != "requested" || st.Follow.Followed != 1 {
		t.Fatalf("at start: %d records mirrored, follow %+v; want billing's one record, 1 service followed", st.Registry.Instances, st.Follow)
	}
	if _, err := c.Balancer("orders"); !errors.Is(err, pushlb.ErrUnknownService) {
		t.Fatalf("Balancer(orders) before any request = %v, want unknown at once", err)
	}

	// The first request follows orders and is routed.
	if got := get(t, client, "http://orders/x"); got != "a /x" {
		t.Fatalf("first request for orders: %q", got)
	}
	if got := c.Services(); !slices.Equal(got, []string{"billing", "orders"}) {
		t.Fatalf("services after a request for orders = %v", got)
	}
	announce(t, srv, "orders", "", testpub.Backend(t, "a2"))
	testutil.Eventually(t, "a second instance of orders, followed on request, to be routed", func() bool {
		b, err := c.Follow(t.Context(), "orders")
		return err == nil && len(b.Servers()) == 2
	})

	// A service nobody registered: unknown, remembered.
	for range 2 {
		if _, err := client.Get("http://ghost/x"); !errors.Is(err, pushlb.ErrUnknownService) {
			t.Fatalf("a request for a service nobody registered: %v", err)
		}
	}
	st := c.Stats()
	if st.Follow.Follows != 1 || st.Follow.NotFound != 1 || st.Follow.NegativeHits != 1 || st.Follow.Followed != 2 {
		t.Fatalf("follow stats %+v: want 1 follow, 1 not found, 1 negative hit, 2 followed", st.Follow)
	}

	// A flood of invented names, at once: each is answered unknown, and
	// nothing of it stays followed.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var odd []error
	for i := range 2000 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if _, err := c.Follow(ctx, fmt.Sprintf("fake-%d", i)); !errors.Is(err, pushlb.ErrUnknownService) {
				mu.Lock()
				odd = append(odd, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(odd) > 0 {
		t.Fatalf("%d invented names were not answered unknown, such as: %v", len(odd), odd[0])
	}
	st = c.Stats()
	if got := c.Services(); !slices.Equal(got, []string{"billing", "orders"}) || st.Follow.Followed != 2 || st.Follow.Following != 0 {
		t.Fatalf("after the flood: services %v, follow %+v; want billing and orders followed, nothing under way", got, st.Follow)
	}
	if n := st.Follow.NotFound + st.Follow.Busy; n != 2001 {
		t.Fatalf("after the flood: %d names not found or refused busy, want 2001 (%+v)", n, st.Follow)
	}
	if st.Registry.Instances != 3 {
		t.Fatalf("after the flood the mirror holds %d records, want billing's 1 and orders' 2", st.Registry.Instances)
	}
	t.Logf("flood of 2,000 invented names: %d not found, %d refused busy", st.Follow.NotFound-1, st.Follow.Busy)
}

// TestIdleServiceIsUnfollowed: a service followed on request that no
// request asks for during IdleUnfollow is unfollowed, records and
// balancer included; the next request follows it again.
func TestIdleServiceIsUnfollowed(t *testing.T) {
	srv := natstest.Start(t)
	announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	c := startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowRequested, IdleUnfollow: 100 * time.Millisecond})
	client := &http.Client{Transport: c.Transport()}
	if got := get(t, client, "http://orders/x"); got != "a /x" {
		t.Fatalf("first request: %q", got)
	}
	testutil.Eventually(t, "orders to be unfollowed once idle", func() bool {
		st := c.Stats()
		return len(c.Services()) == 0 && st.Follow.Followed == 0 && st.Follow.Unfollows == 1
	})
	testutil.Eventually(t, "the mirror to forget orders", func() bool { return c.Stats().Registry.Instances == 0 })
	if got := get(t, client, "http://orders/y"); got != "a /y" {
		t.Fatalf("request after the unfollow: %q", got)
	}
	if st := c.Stats(); st.Follow.Follows != 2 {
		t.Fatalf("follows = %d, want 2", st.Follow.Follows)
	}
}

// TestFollowModeIsChecked: an unknown mode, or services listed with
// follow all, fail New.
func TestFollowModeIsChecked(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	for _, cfg := range []pushlb.Config{
		{Follow: "some"},
		{Follow: pushlb.FollowAll, Services: []string{"orders"}},
	} {
		if _, err := pushlb.New(nc, cfg); !errors.Is(err, pushlb.ErrInvalidOption) {
			t.Errorf("New(%+v) = %v, want ErrInvalidOption", cfg.Follow, err)
		}
	}
}

// TestServiceRevisionIsTheAppliedOne: per service, Stats says which
// registry revision its list reflects, in both modes: once a record
// written at revision r is routed, the service's Revision is r or more.
func TestServiceRevisionIsTheAppliedOne(t *testing.T) {
	srv := natstest.Start(t)
	reg := openRegistry(t, srv)
	for _, mode := range []pushlb.FollowMode{pushlb.FollowAll, pushlb.FollowRequested} {
		t.Run(string(mode), func(t *testing.T) {
			service := "svc-" + string(mode)
			announceAt(t, srv, service, "a1")
			c := startWith(t, srv.Connect(t), pushlb.Config{Follow: mode})
			if _, err := c.Follow(t.Context(), service); err != nil {
				t.Fatal(err)
			}
			announceAt(t, srv, service, "a2")
			e, err := reg.GetEntry(t.Context(), service, "a2")
			if err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, "a2 routed", func() bool {
				b, _ := c.Balancer(service)
				return len(b.Servers()) == 2
			})
			// Routed by the online event, the list may reflect an older
			// revision until the mirror's copy of the record comes.
			var ss pushlb.ServiceStats
			testutil.Eventually(t, "the revision a2 was written at applied", func() bool {
				ss, _ = c.ServiceStats(service)
				return ss.Revision >= e.Revision
			})
			// Another client that routes the same instances has the same
			// list's digest.
			c2 := startWith(t, srv.Connect(t), pushlb.Config{Follow: mode})
			if _, err := c2.Follow(t.Context(), service); err != nil {
				t.Fatal(err)
			}
			var ss2 pushlb.ServiceStats
			testutil.Eventually(t, "the second client's list", func() bool {
				ss2, _ = c2.ServiceStats(service)
				return ss2.Servers == 2 && ss2.Revision >= e.Revision
			})
			if ss.Digest == "" || ss2.Digest != ss.Digest {
				t.Fatalf("digests of the same list: %q and %q", ss.Digest, ss2.Digest)
			}
		})
	}
}

// announceAt announces instance id of service with a backend of its own.
func announceAt(t *testing.T, srv *natstest.Server, service, id string) {
	t.Helper()
	testpub.AnnounceAddr(t, srv.Connect(t), service, "", id, testpub.Backend(t, id).Listener.Addr().String())
}

// openRegistry opens the default registry bucket.
func openRegistry(t *testing.T, srv *natstest.Server) *serverlist.Registry {
	t.Helper()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
