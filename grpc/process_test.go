package pushlbgrpc_test

import (
	"context"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

var listening = regexp.MustCompile(`listening (\S+)`)

// instance is a gRPC server process registered by an announce process
// that joins the client's gossip, as a service instance runs in
// production.
type instance struct {
	addr           string
	server, holder *testutil.Proc
}

func startInstance(t *testing.T, natsURL, gossipAddr, id string) instance {
	t.Helper()
	server := testutil.Start(t, bin.testserver)
	_, m := server.WaitForRegexp(t, listening, 30*time.Second)
	holder := testutil.Start(t, bin.announce, "-nats", natsURL, "-service", "orders", "-id", id, "-addr", m[1],
		"-gossip", gossipAddr, "-gossip-bind", "127.0.0.1:0", "-gossip-profile", "fast")
	return instance{addr: m[1], server: server, holder: holder}
}

// TestSIGKILLedServerProcess: under steady RPC load with retries on, a
// gRPC server process and its announce are SIGKILLed together (a crashed
// host): no RPC fails (the ones on the dying connection are retried), and
// gossip removes the instance from the pushed list (fast profile: about 1 s).
func TestSIGKILLedServerProcess(t *testing.T) {
	srv := natstest.Start(t)
	c := startClientWith(t, srv, pushlb.Config{Gossip: &gossip.Config{BindAddr: "127.0.0.1:0", Profile: gossip.ProfileFast}})
	natsURL := srv.URL()
	insts := []instance{
		startInstance(t, natsURL, c.GossipAddr(), "i0"),
		startInstance(t, natsURL, c.GossipAddr(), "i1"),
		startInstance(t, natsURL, c.GossipAddr(), "i2"),
	}
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{}`, true))
	waitReady(t, conn, insts[0].addr, insts[1].addr, insts[2].addr)

	var sent, failed atomic.Int64
	var lastToDead atomic.Int64 // UnixNano of the start of the last RPC the dead server answered
	var firstErr atomic.Value
	dead := insts[0].addr
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				began := time.Now().UnixNano()
				addr, err := checkCtx(context.Background(), conn)
				sent.Add(1)
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case addr == dead:
					lastToDead.Store(began)
				}
			}
		})
	}
	view, err := c.Balancer("orders")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "RPCs to reach the server to kill", func() bool { return lastToDead.Load() != 0 })
	killed := time.Now()
	for _, p := range []*testutil.Proc{insts[0].server, insts[0].holder} {
		p.Signal(t, syscall.SIGKILL)
	}
	for _, p := range []*testutil.Proc{insts[0].server, insts[0].holder} {
		p.Wait(t, 10*time.Second)
	}
	reaped := time.Now()
	testutil.Eventually(t, "gossip to remove the killed instance", func() bool { return view.Server("i0") == nil })
	removed := time.Since(killed)
	mark := sent.Load()
	testutil.Eventually(t, "100 RPCs after the removal", func() bool { return sent.Load() > mark+100 })
	stop()
	wg.Wait()
	last := time.Duration(lastToDead.Load() - killed.UnixNano())
	t.Logf("%d RPCs, %d failed; the last RPC the killed server answered began %v after the kill signal (reaped %v after it); removed from the list after %v",
		sent.Load(), failed.Load(), last, reaped.Sub(killed), removed)
	if failed.Load() > 0 {
		t.Fatalf("%d of %d RPCs failed; first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}
	if lastToDead.Load() > reaped.UnixNano() {
		t.Fatalf("an RPC begun after the killed server was reaped was answered by it")
	}
}
