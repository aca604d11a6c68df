package main

// Crash detection by the NATS server's client-disconnect advisories, with
// the real binaries: a SIGKILLed instance leaves the gateway's list within
// milliseconds (the advisory, confirmed by a probe), a NATS blip of a live
// instance's connection removes nothing, a frozen instance (SIGSTOP, its
// connection open) is still removed by gossip, and on a three-node cluster
// the advisory of an instance on one node reaches a gateway on another.
//
// The measuring tests run a few rounds by default (CI's correctness run);
// PUSHLB_CRASH_RUNS=20 gives the figures of docs/perf.md:
//
//	PUSHLB_CRASH_RUNS=20 go test -run 'Advisory|Frozen' -count=1 -v ./cmd/gateway/ | grep -E 'p50|---'

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// crashRuns is the number of rounds of a measuring test: PUSHLB_CRASH_RUNS,
// default 3.
func crashRuns(t testing.TB) int {
	v := os.Getenv("PUSHLB_CRASH_RUNS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("PUSHLB_CRASH_RUNS=%q: want a positive number", v)
	}
	return n
}

// distribution logs p50, p90, p99 and max of d.
func distribution(t testing.TB, what string, d []time.Duration) {
	t.Helper()
	t.Logf("%s over %d runs: p50 %v, p90 %v, p99 %v, max %v", what, len(d),
		testutil.Percentile(d, 0.50).Round(100*time.Microsecond), testutil.Percentile(d, 0.90).Round(100*time.Microsecond),
		testutil.Percentile(d, 0.99).Round(100*time.Microsecond), slices.Max(d).Round(100*time.Microsecond))
}

// timelineEntry is one change of the gateway's timeline (/-/lb).
type timelineEntry struct {
	At       time.Time `json:"at"`
	Service  string    `json:"service"`
	Instance string    `json:"instance"`
	Change   string    `json:"change"`
	Source   string    `json:"source"`
}

// left waits until the gateway's timeline shows id leaving, and returns
// that change: its At is when the gateway's balancer applied it.
func (g *gw) left(t testing.TB, id string, timeout time.Duration) timelineEntry {
	t.Helper()
	var found timelineEntry
	testutil.EventuallyWithin(t, timeout, id+" to leave the list", func() bool {
		var st struct {
			Timeline []timelineEntry `json:"timeline"`
		}
		if json.Unmarshal([]byte(g.state(t)), &st) != nil {
			return false
		}
		for _, e := range st.Timeline {
			if e.Instance == id && e.Change == "offline" {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// childOf returns the PID of pid's only child (announce's command).
func childOf(t testing.TB, pid int) int {
	t.Helper()
	// A Go program forks from any of its threads: read every thread's
	// children.
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		testutil.Missing(t, "the threads of a process (/proc/PID/task): %v", err)
	}
	var f []string
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if err != nil {
			testutil.Missing(t, "the children of a process (/proc/PID/task/TID/children): %v", err)
		}
		f = append(f, strings.Fields(string(b))...)
	}
	if len(f) != 1 {
		t.Fatalf("announce %d has children %q, want one", pid, f)
	}
	child, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatal(err)
	}
	return child
}

// waitAdvisoriesOn waits until the gateway's check saw advisories arrive.
func (g *gw) waitAdvisoriesOn(t testing.TB) {
	t.Helper()
	testutil.Eventually(t, "the gateway to receive advisories", func() bool { return g.metric("pushlb_advisories_on") == 1 })
}

func (g *gw) removals(cause string) float64 {
	return g.metric(`pushlb_instance_removals_total{cause="` + cause + `"}`)
}

// startEmbeddedGateway runs the gateway with its embedded NATS server (the
// advisories on with no set-up), and gossip with the fast profile when
// asked.
func startEmbeddedGateway(t testing.TB, gossip bool) (g *gw, gossipAddr string) {
	t.Helper()
	g = &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
	args := []string{"-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats, "-data-dir", t.TempDir(), "-follow", "all"}
	if gossip {
		gossipAddr = testutil.FreeAddr(t)
		args = append(args, "-gossip-bind", gossipAddr, "-gossip-profile", "fast")
	}
	g.Proc = start(t, bin.gateway, args...)
	testutil.Eventually(t, "the gateway", func() bool { return g.state(t) != "" })
	g.waitAdvisoriesOn(t)
	return g, gossipAddr
}

// TestAdvisoryRemovesAKilledAnnounce: under a steady load, an instance run
// by announce (supervise mode: announce and its command, a testbackend)
// is SIGKILLed with its command, as the kernel's OOM killer or a lost
// container takes both. The NATS server's advisory of announce's
// connection reaches the gateway, whose probe of the instance's address is
// refused: the instance leaves the list within milliseconds, with the
// advisory as its cause, and the load sees no failed request (the gateway
// retries a refused connection on the next server). Each round measures
// the time from the kill to the change in the gateway's balancer.
func TestAdvisoryRemovesAKilledAnnounce(t *testing.T) {
	g, _ := startEmbeddedGateway(t, false)
	for _, name := range []string{"s1", "s2"} {
		announceHold(t, g, "orders", newTracked(t, name).addr())
	}
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })
	l := startLoad(g, loadWorkers)
	defer l.stop()

	runs := crashRuns(t)
	var took []time.Duration
	failed := 0
	for i := range runs {
		name, addr := fmt.Sprintf("k%d", i), testutil.FreeAddr(t)
		a := start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", addr, "-id", name, "-drain", "0s",
			"--", bin.backend, "-addr", addr, "-name", name)
		began := time.Now()
		a.WaitFor(t, "announced online", lineTimeout)
		l.waitAnswered(t, name, began)
		child := childOf(t, a.Pid())
		_, failedBefore := l.counts()

		killed := time.Now()
		syscall.Kill(a.Pid(), syscall.SIGKILL)
		syscall.Kill(child, syscall.SIGKILL)
		e := g.left(t, name, lineTimeout)
		if e.Source != "advisory" {
			t.Fatalf("round %d: %s left for %q, want advisory", i, name, e.Source)
		}
		took = append(took, e.At.Sub(killed))
		l.waitMore(t, 50)
		_, failedAfter := l.counts()
		failed += failedAfter - failedBefore
		a.Wait(t, exitTimeout)
	}
	distribution(t, "SIGKILL of announce and its command: kill to removal from the balancer (advisory + probe)", took)
	sent, _ := l.counts()
	t.Logf("load: %d requests, %d failed around %d kills", sent, failed, runs)
	if n := g.removals("advisory"); n != float64(runs) {
		t.Errorf("pushlb_instance_removals_total{cause=advisory} = %v, want %d", n, runs)
	}
	if failed != 0 {
		t.Errorf("%d requests failed around the kills; first: %s", failed, l.first())
	}
}

// TestAdvisoryLastRequestAfterAKill: the instance's own backend outlives
// its announce (hold mode, a backend in the test process), and gossip is
// on, so the probe goes to announce's gossip node, which died with it: the
// backend records every request the gateway still routes to it, which
// gives the time from the kill to the last request routed.
func TestAdvisoryLastRequestAfterAKill(t *testing.T) {
	g, gossipAddr := startEmbeddedGateway(t, true)
	for _, name := range []string{"s1", "s2"} {
		announceGossip(t, g, gossipAddr, newTracked(t, name).addr())
	}
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })
	l := startLoad(g, loadWorkers)
	defer l.stop()

	runs := crashRuns(t)
	var last, removed []time.Duration
	for i := range runs {
		name := fmt.Sprintf("h%d", i)
		b := newTracked(t, name)
		a := announceGossip(t, g, gossipAddr, b.addr(), "-id", name)
		gossipMember(t, a)
		began := time.Now()
		l.waitAnswered(t, name, began)
		killed := time.Now()
		a.Kill(t)
		e := g.left(t, name, lineTimeout)
		if e.Source != "advisory" {
			t.Fatalf("round %d: %s left for %q, want advisory", i, name, e.Source)
		}
		l.waitMore(t, 50) // requests in flight at the removal have arrived
		removed = append(removed, e.At.Sub(killed))
		last = append(last, time.Unix(0, b.last.Load()).Sub(killed))
	}
	distribution(t, "SIGKILL of announce (gossip on, backend alive): kill to removal (advisory + probe of its gossip node)", removed)
	distribution(t, "SIGKILL of announce (gossip on, backend alive): kill to the last request routed to it", last)
	if _, failed := l.counts(); failed != 0 {
		t.Errorf("%d requests failed; first: %s", failed, l.first())
	}
}

// TestAdvisoryRemovesAKilledEmbeddingProcess: a Go program that announces
// itself with the publisher API (examples/embed/service) is SIGKILLed: its
// listener and its NATS connection close together, the probe of its
// address is refused, and it leaves within milliseconds.
func TestAdvisoryRemovesAKilledEmbeddingProcess(t *testing.T) {
	g, _ := startEmbeddedGateway(t, false)
	for _, name := range []string{"s1", "s2"} {
		announceHold(t, g, "orders", newTracked(t, name).addr())
	}
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })
	l := startLoad(g, loadWorkers)
	defer l.stop()

	runs := crashRuns(t)
	var took []time.Duration
	failed := 0
	for i := range runs {
		addr := testutil.FreeAddr(t)
		svc := start(t, bin.service, "-nats", "nats://"+g.nats, "-service", "orders", "-listen", addr)
		id := strings.Split(addr, ":")[0] + ":orders:" + strings.Split(addr, ":")[1]
		began := time.Now()
		l.waitAnswered(t, id, began)
		_, failedBefore := l.counts()
		killed := time.Now()
		svc.Kill(t)
		e := g.left(t, id, lineTimeout)
		if e.Source != "advisory" {
			t.Fatalf("round %d: %s left for %q, want advisory", i, id, e.Source)
		}
		took = append(took, e.At.Sub(killed))
		l.waitMore(t, 50)
		_, failedAfter := l.counts()
		failed += failedAfter - failedBefore
	}
	distribution(t, "SIGKILL of a process embedding the publisher: kill to removal (advisory + probe)", took)
	if failed != 0 {
		t.Errorf("%d requests failed around the kills; first: %s", failed, l.first())
	}
}

// connectionNamed returns the client ID of the connection whose name is
// name on srv, or 0.
func connectionNamed(t testing.TB, srv *server.Server, name string) uint64 {
	t.Helper()
	cz, err := srv.Connz(&server.ConnzOptions{Limit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cz.Conns {
		if c.Name == name {
			return c.Cid
		}
	}
	return 0
}

// TestAdvisoryBlipKeepsTheInstance: the NATS server closes a live
// instance's connection (as a network blip or an operator's kick does)
// while it serves under load: the advisory's probe finds it answering, it
// is never removed, no request fails, and announce reconnects and rewrites
// its record with the new connection. Repeated.
func TestAdvisoryBlipKeepsTheInstance(t *testing.T) {
	srv := natstest.Start(t, natstest.WithAdvisories(t, "lb"))
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-nats", srv.URL(), "-follow", "all")
	g.waitAdvisoriesOn(t)
	var anns []*testutil.Proc
	for _, name := range []string{"b1", "b2"} {
		b := newTracked(t, name)
		anns = append(anns, start(t, bin.announce, "-nats", srv.URL(), "-service", "orders", "-addr", b.addr(), "-id", name, "-drain", "0s"))
	}
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })
	l := startLoad(g, loadWorkers)
	defer l.stop()
	l.waitAnswered(t, "b1", time.Now())
	updates := g.metric(`pushlb_list_updates_total{service="orders"}`)

	runs := crashRuns(t)
	for range runs {
		var cid uint64
		testutil.Eventually(t, "b1's connection", func() bool { cid = connectionNamed(t, srv.NATS(), "announce orders b1"); return cid != 0 })
		probes := g.metric(`pushlb_advisory_probes_total{outcome="alive"}`)
		if err := srv.NATS().DisconnectClientByID(cid); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the probe to find b1 alive", func() bool {
			return g.metric(`pushlb_advisory_probes_total{outcome="alive"}`) == probes+1
		})
		// Re-announced: its record names the new connection, which the
		// next blip closes.
		anns[0].WaitFor(t, "re-announced", lineTimeout)
		l.waitAnswered(t, "b1", time.Now())
	}
	l.waitMore(t, 100)
	if n := g.removals("advisory"); n != 0 {
		t.Errorf("%v instances removed by advisories, want 0", n)
	}
	if d := g.metric(`pushlb_list_updates_total{service="orders"}`) - updates; d != 0 {
		t.Errorf("the list changed %v times during the blips, want 0", d)
	}
	sent, failed := l.counts()
	t.Logf("%d blips of b1's NATS connection under load: %d requests, %d failed, 0 removals", runs, sent, failed)
	if failed != 0 {
		t.Errorf("%d requests failed; first: %s", failed, l.first())
	}
}

// TestAdvisoryOnACluster: three NATS nodes with the accounts of the
// embedded server (natstest.WithAdvisories), the gateway on node 1, the
// instances on node 3. Under a steady load:
//
//   - an instance on node 3 SIGKILLed with announce leaves the gateway's
//     list within milliseconds: the advisory crosses the cluster;
//   - node 3 shuts down and comes back: its instances reconnect to another
//     node, none is removed, no request fails.
func TestAdvisoryOnACluster(t *testing.T) {
	c := natstest.StartCluster(t, 3, natstest.WithAdvisories(t, "lb"))
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-nats", c.Nodes[0].URL(), "-follow", "all")
	g.waitAdvisoriesOn(t)
	node3 := c.Nodes[2].URL()
	for _, name := range []string{"s1", "s2"} {
		start(t, bin.announce, "-nats", node3, "-service", "orders", "-addr", newTracked(t, name).addr(), "-id", name, "-drain", "0s")
	}
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })
	l := startLoad(g, loadWorkers)
	defer l.stop()
	l.waitAnswered(t, "s1", time.Now())

	runs := crashRuns(t)
	var took []time.Duration
	for i := range runs {
		name, addr := fmt.Sprintf("k%d", i), testutil.FreeAddr(t)
		a := start(t, bin.announce, "-nats", node3, "-service", "orders", "-addr", addr, "-id", name, "-drain", "0s",
			"--", bin.backend, "-addr", addr, "-name", name)
		began := time.Now()
		a.WaitFor(t, "announced online", lineTimeout)
		l.waitAnswered(t, name, began)
		child := childOf(t, a.Pid())
		killed := time.Now()
		syscall.Kill(a.Pid(), syscall.SIGKILL)
		syscall.Kill(child, syscall.SIGKILL)
		e := g.left(t, name, lineTimeout)
		if e.Source != "advisory" {
			t.Fatalf("round %d: %s left for %q, want advisory", i, name, e.Source)
		}
		took = append(took, e.At.Sub(killed))
		a.Wait(t, exitTimeout)
	}
	distribution(t, "3-node cluster, instance on node 3, gateway on node 1: kill to removal", took)
	l.waitMore(t, 50)
	if _, failed := l.counts(); failed != 0 {
		t.Fatalf("%d requests failed around the kills; first: %s", failed, l.first())
	}

	// Node 3 goes and comes back: its instances move, nothing is removed.
	removed := g.removals("advisory") + g.removals("gossip") + g.removals("lease") + g.removals("graceful")
	updates := g.metric(`pushlb_list_updates_total{service="orders"}`)
	c.Nodes[2].Shutdown()
	l.waitMore(t, 200)
	c.Nodes[2].Restart(t)
	c.WaitJetStream(t)
	l.waitMore(t, 200)
	if d := g.removals("advisory") + g.removals("gossip") + g.removals("lease") + g.removals("graceful") - removed; d != 0 {
		t.Errorf("%v instances removed while their node restarted, want 0", d)
	}
	if d := g.metric(`pushlb_list_updates_total{service="orders"}`) - updates; d != 0 {
		t.Errorf("the list changed %v times while the instances' node restarted, want 0", d)
	}
	sent, failed := l.counts()
	t.Logf("node 3 restarted under load: %d requests, %d failed; %v probes found an instance alive", sent, failed,
		g.metric(`pushlb_advisory_probes_total{outcome="alive"}`))
	if failed != 0 {
		t.Errorf("%d requests failed; first: %s", failed, l.first())
	}
}

// TestFrozenInstanceRemovedByGossip: a frozen host (SIGSTOP of announce)
// keeps its TCP connection to NATS open, so no advisory comes: gossip with
// the fast profile still removes it, within a second. Each round measures
// the time from the SIGSTOP to the change in the gateway's balancer.
func TestFrozenInstanceRemovedByGossip(t *testing.T) {
	g, gossipAddr := startEmbeddedGateway(t, true)
	for _, name := range []string{"s1", "s2"} {
		announceGossip(t, g, gossipAddr, newTracked(t, name).addr())
	}
	testutil.Eventually(t, "two instances", func() bool { return g.servers(t) == 2 })

	runs := crashRuns(t)
	var took []time.Duration
	for i := range runs {
		name := fmt.Sprintf("f%d", i)
		a := announceGossip(t, g, gossipAddr, newTracked(t, name).addr(), "-id", name)
		gossipMember(t, a)
		// The gateway probes every member, the frozen one too.
		testutil.Eventually(t, "four gossip members", func() bool {
			return g.servers(t) == 3 && g.metric("pushlb_gossip_members") == 4
		})
		stopped := time.Now()
		a.Signal(t, syscall.SIGSTOP)
		e := g.left(t, name, lineTimeout)
		if e.Source != "gossip" {
			t.Fatalf("round %d: %s left for %q, want gossip", i, name, e.Source)
		}
		took = append(took, e.At.Sub(stopped))
		a.Kill(t) // a stopped process dies of SIGKILL too
		testutil.Eventually(t, "three gossip members", func() bool { return g.metric("pushlb_gossip_members") == 3 })
	}
	distribution(t, "SIGSTOP of announce (a frozen host, no advisory): stop to removal by gossip (fast profile)", took)
	if n := g.removals("advisory"); n != 0 {
		t.Errorf("%v removals by advisory: a frozen process's connection stays open", n)
	}
}
