package main

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// servers counts the instances the gateway lists for all services.
func (g *gw) servers(t testing.TB) int { return strings.Count(g.state(t), `"id"`) }

func startGossipGateway(t testing.TB) (*gw, string) {
	t.Helper()
	gossipAddr := testutil.FreeAddr(t)
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats, "-data-dir", t.TempDir(),
		"-gossip-bind", gossipAddr, "-gossip-profile", "fast", "-follow", "all")
	testutil.Eventually(t, "the gateway", func() bool { return g.servers(t) == 0 && g.state(t) != "" })
	return g, gossipAddr
}

func announceGossip(t testing.TB, g *gw, gossipAddr, addr string, flags ...string) *testutil.Proc {
	return announceGossipAs(t, g, gossipAddr, "orders", addr, flags...)
}

func announceGossipAs(t testing.TB, g *gw, gossipAddr, service, addr string, flags ...string) *testutil.Proc {
	args := []string{"-nats", "nats://" + g.nats, "-service", service, "-addr", addr,
		"-gossip", gossipAddr, "-gossip-bind", "127.0.0.1:0", "-gossip-profile", "fast"}
	return start(t, bin.announce, append(args, flags...)...)
}

// restartGossip starts a crashed instance again under the same ID: its
// predecessor's record, still in the registry until its lease ends, is
// taken over (-replace), as a supervisor restarting it would.
func restartGossip(t testing.TB, g *gw, gossipAddr, addr string) *testutil.Proc {
	return announceGossip(t, g, gossipAddr, addr, "-replace")
}

var gossipField = regexp.MustCompile(`"gossip":"([^"]+)"`)

// gossipMember waits until announce has joined gossip and returns its
// gossip address.
func gossipMember(t testing.TB, a *testutil.Proc) string {
	t.Helper()
	l := a.WaitFor(t, "gossip member", lineTimeout)
	m := gossipField.FindStringSubmatch(l.Text)
	if m == nil {
		t.Fatalf("no gossip address in %q", l.Text)
	}
	return m[1]
}

// waitGone waits until the gateway logs that gossip saw the instance node
// at gossipAddr go (dead or left). The gateway's gossip handler runs one
// event at a time: by then it has finished with every earlier one.
func (g *gw) waitGone(t testing.TB, gossipAddr string, timeout time.Duration) testutil.Line {
	t.Helper()
	re := regexp.MustCompile(`gossip: instance gone.*"` + regexp.QuoteMeta(gossipAddr) + `"|"` + regexp.QuoteMeta(gossipAddr) + `".*gossip: instance gone`)
	l, _ := g.WaitForRegexp(t, re, timeout)
	return l
}

// TestCrashDetectedByGossip: a frozen announce (SIGSTOP: a host that
// hangs, whose NATS connection stays open, so no advisory tells of it)
// leaves the gateway's list within the fast profile's bound, long before
// its 30 s lease expires. (A SIGKILLed one leaves sooner, by its NATS
// connection's advisory: advisory_test.go.) Repeated to report percentiles.
func TestCrashDetectedByGossip(t *testing.T) {
	g, gossipAddr := startGossipGateway(t)
	addrs := []string{named(t, "c1").Listener.Addr().String(), named(t, "c2").Listener.Addr().String(), named(t, "c3").Listener.Addr().String()}
	anns := []*testutil.Proc{announceGossip(t, g, gossipAddr, addrs[0]), announceGossip(t, g, gossipAddr, addrs[1]), announceGossip(t, g, gossipAddr, addrs[2])}
	testutil.Eventually(t, "three instances", func() bool { return g.servers(t) == 3 })
	// The removal's cause is asserted, not its speed (BenchmarkDetection
	// measures that): gossip removes the frozen instance long before its
	// 30 s lease could, whatever the machine's load.
	_, bound := gossip.ProfileFast.DetectionTime(4) // three instances and the gateway
	const leaseBound = 15 * time.Second             // half announce's default 30 s lease

	const rounds = 5
	var took []time.Duration
	for i := range rounds {
		// Every instance, the new incarnation too, is a member the gateway
		// probes (itself and three instances): a crash is then detected by
		// gossip within the bound.
		testutil.Eventually(t, "four gossip members", func() bool { return g.metric("pushlb_gossip_members") == 4 })
		anns[0].Signal(t, syscall.SIGSTOP)
		began := time.Now()
		testutil.Eventually(t, "the frozen instance to leave", func() bool { return g.servers(t) == 2 })
		took = append(took, time.Since(began))
		if took[i] > leaseBound {
			t.Errorf("round %d: removal took %v: not gossip's doing (its bound %v), the lease's", i, took[i], bound)
		}
		// A stopped process dies of SIGKILL too.
		anns[0].Kill(t)
		anns[0] = restartGossip(t, g, gossipAddr, addrs[0]) // a new incarnation
		testutil.Eventually(t, "the instance back", func() bool { return g.servers(t) == 3 })
	}
	slices.Sort(took)
	t.Logf("gossip (fast, 4 members): frozen instance removed after p50 %v, max %v over %d freezes (bound %v): %v", took[len(took)/2], took[len(took)-1], rounds, bound, took)
	// At least one removal per freeze; on a starved machine the fast
	// profile may also suspect a live member for a moment (it refutes and
	// comes back), which counts one more.
	if n := g.metric("pushlb_gossip_removals_total"); n < rounds {
		t.Errorf("gossip removed %v instances, want at least %d", n, rounds)
	}
}

// TestLateDeadOfOldIncarnation: the instance restarts (new incarnation)
// before gossip declares its crashed predecessor dead; that late dead must
// not remove the new incarnation.
func TestLateDeadOfOldIncarnation(t *testing.T) {
	g, gossipAddr := startGossipGateway(t)
	addr := named(t, "r1").Listener.Addr().String()
	a := announceGossip(t, g, gossipAddr, addr)
	old := gossipMember(t, a)
	// A sentinel instance of another service, for the end.
	sentinel := announceGossipAs(t, g, gossipAddr, "sentinel", named(t, "s1").Listener.Addr().String())
	gossipMember(t, sentinel)
	testutil.Eventually(t, "both instances listed and gossip members", func() bool {
		return g.servers(t) == 2 && g.metric("pushlb_gossip_members") == 3
	})
	a.Kill(t)
	restartGossip(t, g, gossipAddr, addr) // restarted at once
	_, bound := gossip.ProfileFast.DetectionTime(4)
	began := time.Now()
	g.waitGone(t, old, bound+lineTimeout)
	t.Logf("the old incarnation declared dead after %v (bound %v)", time.Since(began), bound)

	// The gateway logs a gone node before it applies it, one node at a
	// time. To know the late dead was applied or ignored, freeze the
	// sentinel now (a SIGKILL would be reported by its advisory, not by
	// gossip): gossip's removal of it comes after, and shows in the
	// sentinel's list.
	testutil.Eventually(t, "the new incarnation a gossip member", func() bool { return g.metric("pushlb_gossip_members") == 3 })
	sentinel.Signal(t, syscall.SIGSTOP)
	testutil.Eventually(t, "gossip to remove the sentinel", func() bool { return g.metric(`pushlb_servers{service="sentinel"}`) == 0 })
	if n := g.metric("pushlb_gossip_removals_total"); n != 1 {
		t.Fatalf("gossip removed %v instances, want only the sentinel; the late dead of the old incarnation removed the new one", n)
	}
	if n := g.metric(`pushlb_servers{service="orders"}`); n != 1 {
		t.Fatalf("the gateway lists %v instances; the late dead of the old incarnation removed the new one", n)
	}
}

// TestCrashDetectedByLease: with gossip off, a SIGKILLed announce leaves
// the list once its registry lease expires (TTL 1 s here).
func TestCrashDetectedByLease(t *testing.T) {
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats, "-data-dir", t.TempDir(), "-lease", "1s", "-follow", "all")
	testutil.Eventually(t, "the gateway", func() bool { return g.state(t) != "" })
	a := start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", named(t, "l1").Listener.Addr().String(), "-lease", "1s")
	start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", named(t, "l2").Listener.Addr().String(), "-lease", "1s")
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })
	a.Kill(t)
	began := time.Now()
	testutil.Eventually(t, "the crashed instance to leave", func() bool { return g.servers(t) == 1 })
	t.Logf("lease path: crash removed after %v (TTL 1 s)", time.Since(began))
	// The lease's end removed it: the gateway's reaper purged the record
	// (counted once its removal returned, which may be after the list
	// changed).
	testutil.Eventually(t, "the reaper's removal counted", func() bool { return g.metric("pushlb_reaper_removed_total") == 1 })
}

// TestInstancesShareAHostWithTheDefaultGossipBind: two announce -gossip
// on one host, both with the default bind (a free port each, on the
// address that reaches the gateway), both join, and each one's freeze
// (SIGSTOP: no advisory) is removed by gossip with the fast profile, not by
// the 30 s lease.
func TestInstancesShareAHostWithTheDefaultGossipBind(t *testing.T) {
	g, gossipAddr := startGossipGateway(t)
	var anns []*testutil.Proc
	var nodes []string
	for _, name := range []string{"d1", "d2"} {
		a := start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", named(t, name).Listener.Addr().String(),
			"-gossip", gossipAddr, "-gossip-profile", "fast")
		node := gossipMember(t, a)
		if !strings.HasPrefix(node, "127.0.0.1:") || strings.HasSuffix(node, ":"+strconv.Itoa(gossip.DefaultPort)) || slices.Contains(nodes, node) {
			t.Fatalf("announce %s gossips at %s, want a free port of its own on 127.0.0.1 (others: %v)", name, node, nodes)
		}
		// Bound on loopback, where it reaches the gateway, not on every
		// interface: no warning about a keyless gossip open to the network
		// (it would come before the line above).
		if strings.Contains(a.Output(), "gossip has no key") {
			t.Fatalf("announce %s warns of a keyless gossip on loopback:\n%s", name, a.Output())
		}
		anns, nodes = append(anns, a), append(nodes, node)
	}
	testutil.Eventually(t, "both instances listed and gossip members", func() bool {
		return g.servers(t) == 2 && g.metric("pushlb_gossip_members") == 3
	})

	// The removals' cause is asserted (gossip, not the 30 s lease); their
	// speed is logged (ProfileFast expects ~1 s; BenchmarkDetection
	// measures it).
	var took []time.Duration
	for i, a := range anns {
		a.Signal(t, syscall.SIGSTOP)
		began := time.Now()
		testutil.Eventually(t, "the frozen instance to leave", func() bool { return g.servers(t) == len(anns)-1-i })
		took = append(took, time.Since(began))
	}
	if n := g.metric("pushlb_gossip_removals_total"); n != 2 {
		t.Fatalf("gossip removed %v instances, want both (the lease did the rest?)", n)
	}
	t.Logf("two instances on one host, default gossip bind (%v): freezes removed after %v", nodes, took)
}

var (
	idField          = regexp.MustCompile(`"id":"([^"]+)"`)
	incarnationField = regexp.MustCompile(`"incarnation":(\d+)`)
)

// TestRogueGossipNodeChangesNothing: a gossip node that claims a real
// instance's Meta (same service, ID and incarnation) under another name
// and address, then leaves, or dies, is ignored: the instance stays routed,
// and the gateway counts and logs each claim it refused.
func TestRogueGossipNodeChangesNothing(t *testing.T) {
	g, gossipAddr := startGossipGateway(t)
	a := announceGossip(t, g, gossipAddr, named(t, "real").Listener.Addr().String())
	online := a.WaitFor(t, "announced online", lineTimeout)
	id, inc := idField.FindStringSubmatch(online.Text), incarnationField.FindStringSubmatch(online.Text)
	if id == nil || inc == nil {
		t.Fatalf("no id or incarnation in %q", online.Text)
	}
	incarnation, err := strconv.ParseInt(inc[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the instance listed and a gossip member", func() bool {
		return g.servers(t) == 1 && g.metric("pushlb_gossip_members") == 2
	})
	claim := gossip.Meta{Role: gossip.RoleInstance, Service: "orders", InstanceID: id[1], Incarnation: incarnation}

	rogue := func(name string) *gossip.Node {
		n, err := gossip.New(gossip.Config{BindAddr: "127.0.0.1:0", Join: []string{gossipAddr}, Profile: gossip.ProfileFast,
			NodeName: name, Meta: claim}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		if err := n.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// refused waits for the gateway's log of the refused report.
	refused := func(node, report string) {
		t.Helper()
		re := regexp.MustCompile(`"report":"` + report + `","node":"` + regexp.QuoteMeta(node) + `".*ignored a report`)
		g.WaitForRegexp(t, re, 2*lineTimeout)
	}

	left := rogue("rogue-left")
	refused("rogue-left", "alive")
	if err := left.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	left.Close()
	refused("rogue-left", "(left|dead)") // dead when the leave flag had not reached the gateway yet

	dead := rogue("rogue-dead")
	refused("rogue-dead", "alive")
	dead.Close() // a crash: the gateway declares it dead
	refused("rogue-dead", "dead")

	if n := g.metric("pushlb_gossip_ignored_total"); n < 4 {
		t.Fatalf("pushlb_gossip_ignored_total = %v, want at least the 4 refused reports", n)
	}
	if n := g.metric("pushlb_gossip_removals_total"); n != 0 {
		t.Fatalf("gossip removed %v instances", n)
	}
	if n := g.servers(t); n != 1 {
		t.Fatalf("the gateway lists %d instances, want the real one", n)
	}
	if code, body, err := g.hit("/orders/"); err != nil || code != 200 || body != "real" {
		t.Fatalf("GET /orders/ = %d %q %v, want the real instance", code, body, err)
	}
}
