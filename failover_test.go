package pushlb_test

import (
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestClientLeavesACutServer: the NATS server a client is connected to is
// cut from the rest of its cluster (a route partition). Its connection
// stays open and its pings are answered, but nothing reaches it: no event,
// no registry change. The client finds the registry unanswered through
// it, moves to another server of the cluster, and resyncs: an instance
// announced during the cut is in its list, the one it had stayed there.
func TestClientLeavesACutServer(t *testing.T) {
	c, p := natstest.StartPartitionableCluster(t, 3)
	// Pings every 2 s: the client probes the registry as often.
	nc := c.Connect(t, nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(2), nats.ReconnectWait(100*time.Millisecond))
	cut := slices.IndexFunc(c.Nodes, func(n *natstest.Server) bool { return n.URL() == nc.ConnectedUrl() })
	if cut < 0 {
		t.Fatalf("connected to %s, no node's URL", nc.ConnectedUrl())
	}
	other := c.Nodes[(cut+1)%3]
	client := startWith(t, nc, pushlb.Config{Follow: pushlb.FollowAll, Lease: 12 * time.Second, RegistryReplicas: 3})
	// The stream's leader on the majority's side, so that the publishers
	// there write on through the cut.
	c.MoveStreamLeader(t, "KV_pushlb_lb", other)
	ids := func() []string {
		b, err := client.Balancer("orders")
		if err != nil {
			return nil
		}
		var out []string
		for _, s := range b.Servers() {
			out = append(out, s.ID)
		}
		slices.Sort(out)
		return out
	}
	b1 := httptest.NewServer(nil)
	t.Cleanup(b1.Close)
	testpub.AnnounceAddr(t, other.Connect(t), "orders", "", "a", b1.Listener.Addr().String())
	testutil.Eventually(t, "a listed", func() bool { return slices.Equal(ids(), []string{"a"}) })

	at := time.Now()
	p.Isolate(cut)
	b2 := httptest.NewServer(nil)
	t.Cleanup(b2.Close)
	testpub.AnnounceAddr(t, other.Connect(t), "orders", "", "b", b2.Listener.Addr().String())
	testutil.EventuallyWithin(t, time.Minute, "a and b listed", func() bool { return slices.Equal(ids(), []string{"a", "b"}) })
	if nc.ConnectedUrl() == c.Nodes[cut].URL() {
		t.Errorf("still connected to the cut node %s", nc.ConnectedUrl())
	}
	t.Logf("the client's server cut: b, announced during the cut, listed %v after it, through %s", time.Since(at).Round(time.Millisecond), nc.ConnectedUrl())
	p.Heal(cut)
}
