package pushlb_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// TestRegistryLossKeepsTheLastList: three instances of a service, then the
// registry's bucket is deleted under the client (a NATS server that lost
// its store, an operator's mistake). The client recreates the bucket and
// finds it empty; it keeps the last list, says so (Held, ListsHeld), and
// requests keep reaching the live backends. When the instances register
// again the hold ends; a real mass offline afterwards (each instance
// withdrawing) empties the list at once. Real NATS, real backends.
//
// The publishers' lease loops stop before the bucket goes: a live one
// finds its record gone and writes it again, which may reach the registry
// before the client's resync (then nothing is lost, nothing held). The
// instances register again through new publishers.
func TestRegistryLossKeepsTheLastList(t *testing.T) {
	srv := natstest.Start(t)
	var backends []*httptest.Server
	var pubs []*publisher.Publisher
	for _, name := range []string{"a", "b", "c"} {
		b := testpub.Backend(t, name)
		backends = append(backends, b)
		pubs = append(pubs, announce(t, srv, "orders", "", b))
	}
	c := start(t, srv.Connect(t))
	listed := func() int { return listedOf(c, "orders") }
	testutil.Eventually(t, "three instances listed", func() bool { return listed() == 3 })

	for _, p := range pubs {
		p.Close()
	}
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(t.Context(), serverlist.BucketName("lb")); err != nil {
		t.Fatal(err)
	}
	held := func() bool { ss, _ := c.ServiceStats("orders"); return ss.Held }
	testutil.Eventually(t, "the list held", held)
	if n := listed(); n != 3 || c.Stats().ListsHeld != 1 {
		t.Fatalf("while held: %d servers listed, %d lists held; want 3 and 1", n, c.Stats().ListsHeld)
	}
	client := &http.Client{Transport: c.Transport()}
	for i := range 30 {
		if body := get(t, client, "http://orders/"); body == "" {
			t.Fatalf("request %d through the held list got nothing", i)
		}
	}

	// The registry comes back: the instances register again.
	pubs = pubs[:0]
	for _, b := range backends {
		pubs = append(pubs, announce(t, srv, "orders", "", b))
	}
	testutil.Eventually(t, "the hold ended", func() bool { return !held() })
	if n := listed(); n != 3 {
		t.Fatalf("after the registry came back: %d servers, want 3", n)
	}

	// A real mass offline empties the list.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, p := range pubs {
		if err := p.Withdraw(ctx, "test"); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "the list emptied by the offlines", func() bool { return listed() == 0 })
	if held() || c.Stats().ListsHeld != 1 {
		t.Fatalf("a mass offline was held (held %v, lists held %d)", held(), c.Stats().ListsHeld)
	}
}

// TestRegistryLossHoldEnds: the registry purged key by key (the lists
// arrive as several, the first applied); with a short hold the list
// empties once the hold is over, the registry still empty; with the
// protection off it empties at once. The publishers stop first, as in
// TestRegistryLossKeepsTheLastList.
func TestRegistryLossHoldEnds(t *testing.T) {
	for _, hold := range []time.Duration{200 * time.Millisecond, -1} {
		srv := natstest.Start(t)
		var pubs []*publisher.Publisher
		for _, name := range []string{"a", "b"} {
			pubs = append(pubs, announce(t, srv, "orders", "", testpub.Backend(t, name)))
		}
		c := startWith(t, srv.Connect(t), pushlb.Config{EmptyListHold: hold})
		listed := func() int { return listedOf(c, "orders") }
		testutil.Eventually(t, "two instances listed", func() bool { return listed() == 2 })
		js, err := jetstream.New(srv.Connect(t))
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(t.Context(), serverlist.BucketName("lb"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pubs {
			p.Close() // a live publisher writes its purged record again
		}
		keys, err := kv.ListKeys(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for k := range keys.Keys() {
			if err := kv.Purge(t.Context(), k); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, "the list emptied", func() bool { return listed() == 0 })
		if want := uint64(0); hold > 0 {
			want = 1
			if got := c.Stats().ListsHeld; got != want {
				t.Fatalf("hold %v: %d lists held, want %d", hold, got, want)
			}
		} else if got := c.Stats().ListsHeld; got != want {
			t.Fatalf("protection off: %d lists held, want 0", got)
		}
	}
}

// listedOf returns how many servers c's balancer of service lists, 0
// without one.
func listedOf(c *pushlb.Client, service string) int {
	b, err := c.Balancer(service)
	if err != nil {
		return 0
	}
	return len(b.Servers())
}
