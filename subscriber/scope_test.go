package subscriber_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/subscriber"
)

// firstList returns the first list of service the gateway applied.
func (g *gateway) firstList(service string) (events.ListChanged, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, lc := range g.handled {
		if lc.Service == service {
			return lc, true
		}
	}
	return events.ListChanged{}, false
}

// TestScopedSubscriberFollowsOnDemand: a scoped subscriber is sent the
// events and records of the services it follows only; a service it
// follows later starts from the registry's full state; one it unfollows is
// sent nothing more. NATS delivers one publisher's messages in order, so
// an event of an unfollowed service published before one of a followed
// service would be received first if it were sent: the Received counter
// once the second is applied proves it was not.
func TestScopedSubscriberFollowsOnDemand(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	pub := newPublisher(t, srv)
	for i := 1; i <= 3; i++ {
		if err := newPublisher(t, srv).Announce(ctx, instance("orders", i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Announce(ctx, instance("billing", 1, 1)); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, srv, subscriber.Config{Services: []string{"billing"}})
	testutil.Eventually(t, "billing's list", func() bool { return len(g.ids("billing")) == 1 })
	if _, ok := g.sub.Live()["orders"]; ok || len(g.sub.Mirror().Service("orders")) != 0 {
		t.Fatal("a scoped subscriber holds a service it does not follow")
	}

	// sentOnly announces an instance of other and then one of followed,
	// and checks that only the second reached the subscriber.
	n := 10
	sentOnly := func(followed, other string) {
		t.Helper()
		n++
		before := g.sub.Stats()
		if err := newPublisher(t, srv).Announce(ctx, instance(other, n, 1)); err != nil {
			t.Fatal(err)
		}
		in := instance(followed, n, 1)
		if err := newPublisher(t, srv).Announce(ctx, in); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the followed service's event and list", func() bool {
			return g.appliedWith(followed, in.InstanceID) && g.sub.Stats().Received > before.Received
		})
		after := g.sub.Stats()
		if got := after.Received - before.Received; got != 1 {
			t.Fatalf("received %d events for one announcement of a followed service and one of an unfollowed one, want 1", got)
		}
		if after.Dropped[subscriber.DropUnsubscribed] != 0 {
			t.Fatalf("the subscriber was sent events of an unfollowed service: %+v", after.Dropped)
		}
	}
	sentOnly("billing", "orders")
	if got := eventSubjects(t, srv, g); !slices.Equal(got, []string{"lb.svc.billing.*"}) {
		t.Fatalf("the gateway's connection subscribes to %v, want billing's events only", got)
	}

	found, err := g.sub.Follow(ctx, "orders")
	if err != nil || !found {
		t.Fatalf("Follow(orders) = %v, %v; want found", found, err)
	}
	// The balancer takes a list before the test's handler records it:
	// wait for the record.
	testutil.Eventually(t, "orders' first list", func() bool { _, ok := g.firstList("orders"); return ok })
	if lc, _ := g.firstList("orders"); len(lc.InstanceIDs) != 4 {
		t.Fatalf("the first list of a service followed on demand = %+v, want the registry's 4 instances", lc)
	}
	testutil.Eventually(t, "orders' list", func() bool { return len(g.ids("orders")) == 4 })
	if found, err := g.sub.Follow(ctx, "ghost"); err != nil || found {
		t.Fatalf("Follow(ghost) = %v, %v; want not found", found, err)
	}
	if got := g.sub.Followed(); !slices.Equal(got, []string{"billing", "ghost", "orders"}) {
		t.Fatalf("Followed() = %v", got)
	}

	if ok, err := g.sub.Unfollow("orders"); !ok || err != nil {
		t.Fatalf("Unfollow(orders) = %v, %v", ok, err)
	}
	if _, ok := g.sub.Live()["orders"]; ok {
		t.Fatal("an unfollowed service is still in the table")
	}
	sentOnly("billing", "orders")
	if got := eventSubjects(t, srv, g); !slices.Equal(got, []string{"lb.svc.billing.*", "lb.svc.ghost.*"}) {
		t.Fatalf("after Unfollow(orders) the gateway's connection subscribes to %v", got)
	}
	testutil.Eventually(t, "the mirror to forget orders", func() bool { return len(g.sub.Mirror().Service("orders")) == 0 })
	if st := g.sub.Stats(); st.Follows != 2 || st.Unfollows != 1 || st.Followed != 2 {
		t.Fatalf("stats: follows %d, unfollows %d, followed %d; want 2, 1, 2", st.Follows, st.Unfollows, st.Followed)
	}
	if ok, _ := g.sub.Unfollow("orders"); ok {
		t.Fatal("a second Unfollow reported a followed service")
	}
	if _, err := g.sub.Follow(ctx, "a.b"); !errors.Is(err, events.ErrInvalidService) {
		t.Fatalf("Follow(a.b) = %v, want ErrInvalidService", err)
	}
}

// eventSubjects returns the event subjects the NATS server holds for the
// gateway's connection, sorted.
func eventSubjects(t *testing.T, srv *natstest.Server, g *gateway) []string {
	t.Helper()
	cid, err := g.nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	cz, err := srv.NATS().Connz(&server.ConnzOptions{CID: cid, Subscriptions: true})
	if err != nil || len(cz.Conns) != 1 {
		t.Fatalf("Connz(%d): %v, %d connections", cid, err, len(cz.Conns))
	}
	var out []string
	for _, subj := range cz.Conns[0].Subs {
		if strings.HasPrefix(subj, "lb.") {
			out = append(out, subj)
		}
	}
	slices.Sort(out)
	return out
}

// TestUnscopedSubscriberRefusesFollow: a subscriber that follows every
// service has nothing to follow on demand.
func TestUnscopedSubscriberRefusesFollow(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	if _, err := g.sub.Follow(t.Context(), "orders"); !errors.Is(err, subscriber.ErrNotScoped) {
		t.Fatalf("Follow = %v, want ErrNotScoped", err)
	}
	if _, err := g.sub.Unfollow("orders"); !errors.Is(err, subscriber.ErrNotScoped) {
		t.Fatalf("Unfollow = %v, want ErrNotScoped", err)
	}
	if g.sub.Followed() != nil {
		t.Fatal("Followed of an unscoped subscriber is not nil")
	}
}
