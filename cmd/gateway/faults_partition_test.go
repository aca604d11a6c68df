package main

// Route partitions on a real three-node JetStream cluster whose routes
// go through proxies the test controls (natstest.StartPartitionableCluster),
// with the real gateway and announce binaries: a node cut from the other
// two while its clients still reach it.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// partitionLease is the registry lease of the partition tests. A lease
// renewed last one renewal interval (a third of it) before the cut must
// outlast the cut node's detection (the next renewal unanswered: one
// interval and a half) and the majority's election of a new leader for
// the stream (nats-server elects 4-9 s after the old leader's last
// heartbeat), so that the moved announcer can write: 24 s leaves it 16 s.
const partitionLease = 24 * time.Second

// nodeOf returns the index of the node whose client URL the log line
// names ("connected to NATS" and "gateway started" lines carry it).
func nodeOf(t *testing.T, c *natstest.Cluster, line string) int {
	t.Helper()
	for i, n := range c.Nodes {
		if strings.Contains(line, `"`+n.URL()+`"`) {
			return i
		}
	}
	t.Fatalf("no node's URL in %s", line)
	return -1
}

// othersThan returns the client URLs of every node but node i,
// comma-separated.
func othersThan(c *natstest.Cluster, i int) string {
	var urls []string
	for j, n := range c.Nodes {
		if j != i {
			urls = append(urls, n.URL())
		}
	}
	return strings.Join(urls, ",")
}

// TestClusterPartitionIsolatesTheLeader: a route partition cuts the node
// that leads the registry stream from the other two, which elect a new
// leader; its clients still reach it, but it can no longer write. An
// announcer connected to it moves to the others before its lease ends.
// The gateway, on the majority's nodes, keeps routing: no request fails,
// no live instance leaves the list, and once the partition heals the
// registry and the list are right.
func TestClusterPartitionIsolatesTheLeader(t *testing.T) {
	c, p := natstest.StartPartitionableCluster(t, 3)
	const lease = partitionLease
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{TTL: lease, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	r := &faultRig{c: c}
	// i1 is given every node and picks one: that node is the one cut, and
	// is made the stream's leader before the cut. The lease is given: no
	// second connection fitted to the bucket's (which would pick anew).
	announce := func(b *tracked, urls string) *testutil.Proc {
		return start(t, bin.announce, "-nats", urls, "-service", "orders", "-addr", b.addr(), "-id", b.name, "-drain", "0s", "-lease", lease.String())
	}
	b := newTracked(t, "i1")
	a := announce(b, c.URL())
	isolated := nodeOf(t, c, a.WaitFor(t, "connected to NATS", lineTimeout).Text)
	a.WaitFor(t, "announced online", lineTimeout)
	r.backends, r.anns, r.live = append(r.backends, b), append(r.anns, a), append(r.live, b.name)
	// The gateway, i2 and i3 on the majority's nodes only.
	majority := othersThan(c, isolated)
	r.g = &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	r.g.Proc = start(t, bin.gateway, "-listen", r.g.proxy, "-admin", r.g.admin, "-nats", majority, "-follow", "all")
	r.g.waitHealthy(t)
	for i := 2; i <= 3; i++ {
		b := newTracked(t, fmt.Sprintf("i%d", i))
		a := announce(b, majority)
		a.WaitFor(t, "announced online", lineTimeout)
		r.backends, r.anns, r.live = append(r.backends, b), append(r.anns, a), append(r.live, b.name)
	}
	testutil.Eventually(t, "three instances listed", func() bool { return slices.Equal(r.g.ids(t), r.live) })
	r.l, r.lg = startLoad(r.g, loadWorkers), r.g
	t.Cleanup(r.l.stop)
	r.l.waitMore(t, 100)
	updates := r.g.metric(`pushlb_list_updates_total{service="orders"}`)

	c.MoveStreamLeader(t, registryStream, c.Nodes[isolated])
	cut := time.Now()
	p.Isolate(isolated)
	// Until its lost quorum makes it step down (10 s and more), the cut
	// node still leads, as far as it knows.
	ledAtCut := c.StreamLeader(registryStream) == c.Nodes[isolated]
	r.anns[0].WaitFor(t, "lease refresh failed", 4*lease)
	failed := time.Since(cut)
	r.anns[0].WaitFor(t, "re-announced", 4*lease)
	moved := time.Since(cut)
	// A lease and a half of partition: a lease the move did not renew in
	// time would have ended, and its record been reaped.
	testutil.EventuallyWithin(t, 4*lease, "a lease and a half of partition", func() bool { return time.Since(cut) > lease+lease/2 })
	p.Heal(isolated)
	c.WaitJetStream(t)
	took := r.healed(t, cut)
	t.Logf("the stream's leader (still leading at the cut: %v) cut from the others, lease %v: the announcer on it failed a renewal %v after the cut, moved and announced again %v after it; right %v after it; the list changed %v times",
		ledAtCut, lease, failed.Round(time.Millisecond), moved.Round(time.Millisecond), took.Round(time.Millisecond), r.g.metric(`pushlb_list_updates_total{service="orders"}`)-updates)
	if d := r.g.metric(`pushlb_list_updates_total{service="orders"}`) - updates; d != 0 {
		t.Errorf("the list changed %v times, want 0: a live instance left it", d)
	}
}

// timeline returns the gateway's timeline of list changes (/-/lb).
func (g *gw) timeline(t testing.TB) []timelineEntry {
	t.Helper()
	var st struct {
		Timeline []timelineEntry `json:"timeline"`
	}
	if err := json.Unmarshal([]byte(g.state(t)), &st); err != nil {
		t.Fatalf("the gateway's state: %v", err)
	}
	return st.Timeline
}

// TestGatewayNodeCut: the node the gateway is connected to is cut from
// the other two (a route partition), the registry stream led by one of
// those, or by the cut node itself (which then leads on, as far as it
// knows, until its lost quorum makes it step down, and the majority elects
// another: a longer lease, so that the announcers' leases outlast the
// election). The gateway's connection stays open and its pings are
// answered, but nothing reaches it through that node: no event, no
// registry change. Meanwhile an instance stops and another starts on the
// majority's side. The gateway finds the registry unanswered through its
// node, moves to another (failover.go in the root package) and resyncs:
//
//   - no request fails: while cut it routes on its last list (the stopped
//     instance's backend still answers, as in the churn faults);
//   - no instance that lives leaves its list at any time (its timeline);
//   - its list is right again (the stopped one out, the new one in), and
//     the stopped one got at most the requests in flight at its removal.
//
// It logs how long after the cut the gateway moved and its list was
// right; it asserts no duration.
func TestGatewayNodeCut(t *testing.T) {
	t.Run("another node leads the stream", func(t *testing.T) { gatewayNodeCut(t, false) })
	t.Run("the gateway's node leads the stream", func(t *testing.T) { gatewayNodeCut(t, true) })
}

func gatewayNodeCut(t *testing.T, leads bool) {
	c, p := natstest.StartPartitionableCluster(t, 3)
	lease := 12 * time.Second // pings, and the gateway's probes, every 2 s
	if leads {
		lease = partitionLease // every 4 s
	}
	r := &faultRig{c: c}
	r.g = &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	r.g.Proc = start(t, bin.gateway, "-listen", r.g.proxy, "-admin", r.g.admin, "-nats", c.URL(), "-follow", "all", "-lease", lease.String())
	cut := nodeOf(t, c, r.g.WaitFor(t, "gateway started", lineTimeout).Text)
	r.g.waitHealthy(t)
	// The announcers on the majority's nodes.
	majority := othersThan(c, cut)
	leader := c.Nodes[(cut+1)%3]
	if leads {
		leader = c.Nodes[cut]
	}
	c.MoveStreamLeader(t, registryStream, leader)
	announce := func(b *tracked) *testutil.Proc {
		return start(t, bin.announce, "-nats", majority, "-service", "orders", "-addr", b.addr(), "-id", b.name, "-drain", "0s", "-lease", lease.String())
	}
	for i := range 3 {
		b := newTracked(t, fmt.Sprintf("i%d", i+1))
		r.backends, r.anns = append(r.backends, b), append(r.anns, announce(b))
		r.live = append(r.live, b.name)
	}
	testutil.Eventually(t, "three instances listed", func() bool { return slices.Equal(r.g.ids(t), r.live) })
	r.l, r.lg = startLoad(r.g, loadWorkers), r.g
	t.Cleanup(r.l.stop)
	r.l.waitMore(t, 100)

	// A cut node that leads the JetStream meta group delays the resync
	// (its consumer waits for the majority's new meta leader): logged.
	meta := c.Nodes[cut].NATS().JetStreamIsLeader()
	at := time.Now()
	p.Isolate(cut)
	t.Cleanup(func() { p.Heal(cut) }) // before the processes stop, if the test fails
	// The majority's nodes drop their routes to the cut node (their pings
	// notice within a second): until then a request they route to it (a
	// registry read, answered by any replica) is lost, as any request in
	// flight at a partition.
	testutil.Eventually(t, "the partition noticed", func() bool {
		for i, n := range c.Nodes {
			if want := map[bool]int{true: 0, false: 1}[i == cut]; n.NATS().NumRoutes() != want {
				return false
			}
		}
		return true
	})
	if leads {
		// The instance changes need the registry: the majority's new
		// leader.
		testutil.EventuallyWithin(t, 4*lease, "a leader of the stream on the majority's side", func() bool {
			for i, n := range c.Nodes {
				if i != cut && n.NATS().JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, registryStream) {
					return true
				}
			}
			return false
		})
	}
	// i1 stops (offline, deregistered), i4 starts: neither reaches the
	// gateway through its node.
	if code := r.anns[0].Stop(t, exitTimeout); code != 0 {
		t.Fatalf("announce i1 exited %d", code)
	}
	b := newTracked(t, "i4")
	a := announce(b)
	a.WaitFor(t, "announced online", lineTimeout)
	changed := time.Since(at)
	stopped := r.backends[0]
	r.backends, r.anns = append(r.backends[1:], b), append(r.anns[1:], a)
	r.live = []string{"i2", "i3", "i4"}

	moveLine := r.g.WaitFor(t, "moving to another server of the cluster", 4*lease)
	moved := moveLine.At.Sub(at)
	r.g.WaitFor(t, "reconnected to NATS", 4*lease)
	testutil.EventuallyWithin(t, 4*lease, "the gateway to list i2, i3, i4", func() bool { return slices.Equal(r.g.ids(t), r.live) })
	right := time.Since(at)
	if n := r.g.metric("pushlb_registry_failover_moves_total"); n != 1 {
		t.Errorf("pushlb_registry_failover_moves_total %v after the move, want 1", n)
	}
	if n := r.g.metric(`pushlb_registry_probes_total{result="unanswered"}`); n < 3 {
		t.Errorf(`pushlb_registry_probes_total{result="unanswered"} %v after the move, want 3 or more`, n)
	}
	r.gone = append(r.gone, goneInstance{b: stopped, hits: stopped.hits.Load()})
	p.Heal(cut)
	c.WaitJetStream(t)
	r.healed(t, at)

	var log []string
	for _, e := range r.g.timeline(t) {
		if e.At.Before(at) {
			continue
		}
		log = append(log, e.Instance+" "+e.Change+" ("+e.Source+")")
		if e.Change == "offline" && e.Instance != "i1" {
			t.Errorf("%s left the list at %v: a live instance unrouted", e.Instance, e.At.Sub(at))
		}
	}
	t.Logf("the gateway's node (the stream's leader: %v, the JetStream meta leader: %v) cut from the others, lease %v: i1 stopped and i4 announced %v after the cut; the gateway moved %v after it and listed i2, i3, i4 %v after it; its changes: %s",
		leads, meta, lease, changed.Round(time.Millisecond), moved.Round(time.Millisecond), right.Round(time.Millisecond), strings.Join(log, ", "))
}
