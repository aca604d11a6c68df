package pushlbxds_test

import (
	"slices"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestOnDemand: over a client that follows on request, the server follows
// what the xDS streams subscribe to. grpc-go's client on xds:///orders
// reaches orders' instance, and billing, registered but never asked for,
// is not followed. orders stays followed while the stream subscribes to
// it, past the client's IdleUnfollow (stock, followed by one request and
// idle since, is unfollowed meanwhile), and is unfollowed once the stream
// ends.
func TestOnDemand(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{Follow: pushlb.FollowRequested, IdleUnfollow: 300 * time.Millisecond})
	nc := srv.Connect(t)
	a := startGRPCServer(t)
	testpub.AnnounceAddr(t, nc, "orders", "", "orders-1", a.addr)
	testpub.AnnounceAddr(t, nc, "billing", "", "billing-1", startGRPCServer(t).addr)
	testpub.AnnounceAddr(t, nc, "stock", "", "stock-1", startGRPCServer(t).addr)
	x, addr := startXDS(t, c)

	conn := xdsConn(t, addr, "", "xds:///orders")
	reachesAll(t, conn, "orders, followed on demand", a.addr)
	// Counted once Follow returned, which may be after the resources went.
	testutil.Eventually(t, "the follow counted", func() bool { return x.Stats().Follows >= 1 })
	if st := x.Stats(); st.Follows != 1 || st.Services != 1 || st.NACKs != 0 {
		t.Fatalf("stats once orders is reached: %+v; want 1 follow, 1 service", st)
	}
	if got := c.Services(); !slices.Equal(got, []string{"orders"}) {
		t.Fatalf("the client follows %v, want orders only", got)
	}

	if _, err := c.Follow(t.Context(), "stock"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "stock, idle, to be unfollowed", func() bool { return !slices.Contains(c.Services(), "stock") })
	if !slices.Contains(c.Services(), "orders") {
		t.Fatal("orders was unfollowed while a stream subscribes to it")
	}
	if _, err := check(conn); err != nil {
		t.Fatalf("an RPC on orders after an idle window: %v", err)
	}

	conn.Close()
	testutil.Eventually(t, "orders to be unfollowed once no stream subscribes to it", func() bool { return len(c.Services()) == 0 })
}

// TestOnDemandServiceAnnouncedLater: a stream that asks for a service
// nobody registered yet gets it once an instance announces it: the server
// follows the name again while the stream subscribes to it.
func TestOnDemandServiceAnnouncedLater(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{Follow: pushlb.FollowRequested})
	x, addr := startXDS(t, c)
	conn := xdsConn(t, addr, "", "xds:///later")
	conn.Connect()
	testutil.Eventually(t, "the name to be asked for and not found", func() bool { return x.Stats().FollowsFailed >= 1 })
	s := startGRPCServer(t)
	testpub.AnnounceAddr(t, srv.Connect(t), "later", "", "later-1", s.addr)
	reachesAll(t, conn, "the announced instance", s.addr)
	// Counted once Follow returned, which may be after the resources went.
	testutil.Eventually(t, "the follow counted", func() bool { return x.Stats().Follows == 1 })
}

// TestOnDemandDelta: a delta stream (Envoy's, or grpc-go's with delta)
// that subscribes to a Listener gets it once the server followed the
// service, and the service is unfollowed once the stream unsubscribes.
func TestOnDemandDelta(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{Follow: pushlb.FollowRequested, IdleUnfollow: 200 * time.Millisecond})
	testpub.AnnounceAddr(t, srv.Connect(t), "orders", "", "orders-1", "127.0.0.1:1")
	x, addr := startXDS(t, c)
	d := openDelta(t, addr, "")
	d.subscribe(resource.ListenerType, "orders")
	if _, got := d.next("the Listener of orders"); !slices.Equal(names(got), []string{"orders"}) {
		t.Fatalf("the response holds %v, want the Listener orders", names(got))
	}
	// Counted once Follow returned, which may be after the Listener went.
	testutil.Eventually(t, "the follow counted", func() bool { return x.Stats().Follows == 1 })
	if err := d.s.Send(&discoverypb.DeltaDiscoveryRequest{Node: d.node, TypeUrl: resource.ListenerType, ResourceNamesUnsubscribe: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "orders to be unfollowed once unsubscribed", func() bool { return len(c.Services()) == 0 })
}
