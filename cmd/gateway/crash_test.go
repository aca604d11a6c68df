package main

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testutil"
)

// servers counts the instances the gateway lists for all services.
func (g *gw) servers(t testing.TB) int { return strings.Count(g.state(t), `"id"`) }

// kill SIGKILLs a process: a crash, announcing nothing.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func startGossipGateway(t testing.TB) (*gw, string) {
	t.Helper()
	gossipAddr := freePort(t)
	g := &gw{proxy: freePort(t), admin: freePort(t), nats: freePort(t)}
	g.proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats, "-data-dir", t.TempDir(),
		"-gossip-bind", gossipAddr, "-gossip-profile", "fast")
	testutil.Eventually(t, "the gateway", func() bool { return g.servers(t) == 0 && g.state(t) != "" })
	return g, gossipAddr
}

func announceGossip(t testing.TB, g *gw, gossipAddr, addr string) *proc {
	return start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", addr,
		"-gossip", gossipAddr, "-gossip-bind", "127.0.0.1:0", "-gossip-profile", "fast")
}

// TestCrashDetectedByGossip: a SIGKILLed announce (the instance's
// supervisor crashed with it) leaves the gateway's list within the fast
// profile's bound, long before its 30 s lease expires. Repeated to report
// percentiles.
func TestCrashDetectedByGossip(t *testing.T) {
	g, gossipAddr := startGossipGateway(t)
	addrs := []string{named(t, "c1").Listener.Addr().String(), named(t, "c2").Listener.Addr().String(), named(t, "c3").Listener.Addr().String()}
	anns := []*proc{announceGossip(t, g, gossipAddr, addrs[0]), announceGossip(t, g, gossipAddr, addrs[1]), announceGossip(t, g, gossipAddr, addrs[2])}
	testutil.Eventually(t, "three instances", func() bool { return g.servers(t) == 3 })
	_, bound := gossip.ProfileFast.DetectionTime(4) // three instances and the gateway
	bound += time.Second                            // a loaded 2-core machine runs three processes per node here

	const rounds = 5
	var took []time.Duration
	for i := range rounds {
		time.Sleep(300 * time.Millisecond) // let the new member settle into the probe rotation
		anns[0].kill(t)
		began := time.Now()
		testutil.Eventually(t, "the crashed instance to leave", func() bool { return g.servers(t) == 2 })
		took = append(took, time.Since(began))
		if took[i] > bound {
			t.Errorf("round %d: detection took %v, bound %v", i, took[i], bound)
		}
		anns[0] = announceGossip(t, g, gossipAddr, addrs[0]) // a new incarnation
		testutil.Eventually(t, "the instance back", func() bool { return g.servers(t) == 3 })
	}
	slices.Sort(took)
	t.Logf("gossip (fast, 4 members): crash removed after p50 %v, max %v over %d crashes: %v", took[len(took)/2], took[len(took)-1], rounds, took)
}

// TestLateDeadOfOldIncarnation: the instance restarts (new incarnation)
// before gossip declares its crashed predecessor dead; that late dead must
// not remove the new incarnation.
func TestLateDeadOfOldIncarnation(t *testing.T) {
	g, gossipAddr := startGossipGateway(t)
	addr := named(t, "r1").Listener.Addr().String()
	a := announceGossip(t, g, gossipAddr, addr)
	testutil.Eventually(t, "the instance", func() bool { return g.servers(t) == 1 })
	a.kill(t)
	announceGossip(t, g, gossipAddr, addr) // restarted at once
	_, bound := gossip.ProfileFast.DetectionTime(3)
	deadline := time.Now().Add(bound + time.Second)
	for time.Now().Before(deadline) {
		if n := g.servers(t); n != 1 {
			t.Fatalf("the gateway lists %d instances; the late dead of the old incarnation removed the new one", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCrashDetectedByLease: with gossip off, a SIGKILLed announce leaves
// the list once its registry lease expires (TTL 1 s here).
func TestCrashDetectedByLease(t *testing.T) {
	g := &gw{proxy: freePort(t), admin: freePort(t), nats: freePort(t)}
	g.proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats, "-data-dir", t.TempDir(), "-lease", "1s")
	testutil.Eventually(t, "the gateway", func() bool { return g.state(t) != "" })
	a := start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", named(t, "l1").Listener.Addr().String(), "-lease", "1s")
	start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", named(t, "l2").Listener.Addr().String(), "-lease", "1s")
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })
	a.kill(t)
	began := time.Now()
	testutil.Eventually(t, "the crashed instance to leave", func() bool { return g.servers(t) == 1 })
	took := time.Since(began)
	t.Logf("lease path: crash removed after %v (TTL 1 s)", took)
	if took > 3*time.Second {
		t.Fatalf("took %v, want within the TTL plus a margin (3 s)", took)
	}
}
