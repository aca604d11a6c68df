package main

// Route partitions on a real three-node JetStream cluster whose routes
// go through proxies the test controls (natstest.StartPartitionableCluster),
// with the real gateway and announce binaries: a node cut from the other
// two while its clients still reach it.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

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
