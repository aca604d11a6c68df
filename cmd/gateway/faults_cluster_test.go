package main

// Registry faults on a real three-node JetStream cluster (in-process
// nats-servers) with the real gateway and announce binaries: every node
// losing its store, and the registry stream losing its quorum for a while.

import (
	"context"
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

// faultRig is a three-node cluster, a gateway given every node's URL with
// the cluster tests' lease, three announcers of orders (hold mode, each
// given every URL) and a steady load through the gateway.
type faultRig struct {
	c        *natstest.Cluster
	g        *gw
	backends []*tracked
	anns     []*testutil.Proc
	live     []string
	l        *load
	lg       *gw // the gateway the load goes through
	// gone are the instances the churn stopped, with the requests they
	// had answered once the load's gateway had removed them.
	gone []goneInstance
}

// goneInstance is a stopped instance and its answers at its removal.
type goneInstance struct {
	b    *tracked
	hits int64
}

func startFaultRig(t *testing.T) *faultRig {
	t.Helper()
	r := &faultRig{c: natstest.StartCluster(t, 3)}
	r.g = &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	r.g.Proc = start(t, bin.gateway, "-listen", r.g.proxy, "-admin", r.g.admin, "-nats", r.c.URL(), "-follow", "all",
		"-lease", clusterLease.String())
	// The gateway makes the bucket, with its lease, before any announcer
	// would make it with the default one.
	r.g.waitHealthy(t)
	for i := range 3 {
		b := newTracked(t, fmt.Sprintf("i%d", i+1))
		r.backends, r.anns = append(r.backends, b), append(r.anns, announceOn(t, r.c.URL(), b))
		r.live = append(r.live, b.name)
	}
	testutil.Eventually(t, "three instances listed", func() bool { return slices.Equal(r.g.ids(t), r.live) })
	r.l, r.lg = startLoad(r.g, loadWorkers), r.g
	t.Cleanup(r.l.stop)
	r.l.waitMore(t, 100)
	return r
}

// registry returns the registry bucket, once the cluster serves it.
func (r *faultRig) registry(t *testing.T) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(r.c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	var kv jetstream.KeyValue
	testutil.Eventually(t, "the registry bucket", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		kv, err = js.KeyValue(ctx, "pushlb_lb")
		return err == nil
	})
	return kv
}

// healed waits until the registry and the gateway hold exactly the live
// instances, and the load went on past it; it returns how long that took
// from since, and fails the test on any failed request.
func (r *faultRig) healed(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	kv := r.registry(t)
	testutil.Eventually(t, "the registry to hold every live instance", func() bool {
		return slices.Equal(registryIDsOrNil(kv), r.live)
	})
	testutil.Eventually(t, "the gateway to list every live instance", func() bool { return slices.Equal(r.g.ids(t), r.live) })
	took := time.Since(since)
	r.l.waitMore(t, 100)
	// A stopped instance (its backend still answers here) gets at most
	// the requests in flight at its removal, one per load worker.
	late := int64(0)
	for _, g := range r.gone {
		extra := g.b.hits.Load() - g.hits
		late += extra
		if extra > loadWorkers {
			t.Errorf("%s answered %d requests after its removal, want at most %d in flight", g.b.name, extra, loadWorkers)
		}
	}
	if len(r.gone) > 0 {
		t.Logf("%d stopped instances answered %d requests after their removal (in flight then)", len(r.gone), late)
	}
	sent, failed := r.l.counts()
	t.Logf("load: %d requests, %d failed, slowest %v", sent, failed, time.Duration(r.l.slowest.Load()))
	if failed != 0 {
		t.Fatalf("%d of %d requests failed; first: %s", failed, sent, r.l.first())
	}
	return took
}

// registryIDsOrNil is registryIDs that answers nil while the registry
// cannot be listed.
func registryIDsOrNil(kv jetstream.KeyValue) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lister, err := kv.ListKeysFiltered(ctx, "orders.*")
	if err != nil {
		return nil
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	var out []string
	for _, k := range keys {
		if _, id, err := serverlist.DecodeKey(k); err == nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// TestClusterLosesEveryStore: every node of the cluster is killed and
// comes back without its store (the registry bucket gone on all three).
// The gateway keeps routing on its last lists (no request fails), the
// bucket is recreated, the announcers write their records back, and the
// registry and the gateway's lists are right again.
func TestClusterLosesEveryStore(t *testing.T) {
	r := startFaultRig(t)
	updates := r.g.metric(`pushlb_list_updates_total{service="orders"}`)
	for _, n := range r.c.Nodes {
		n.Shutdown()
	}
	for _, n := range r.c.Nodes {
		n.RestartWithoutStore(t)
	}
	back := time.Now()
	r.c.WaitJetStream(t)
	ready := time.Now()
	took := r.healed(t, ready)
	t.Logf("every store lost: JetStream back %v after the nodes restarted, registry and lists right %v after that; the list changed %v times",
		ready.Sub(back).Round(time.Millisecond), took.Round(time.Millisecond), r.g.metric(`pushlb_list_updates_total{service="orders"}`)-updates)
}

// TestClusterRegistryLosesQuorum: two of the three nodes stop, so the
// registry stream (three replicas) has no quorum: no write, no lease
// renewal succeeds. Every announcer notices (a failed renewal), and the
// outage lasts until then and two leases more; the nodes come back. The
// gateway keeps routing on its last lists throughout (no request fails),
// and the registry and its lists are right again once the quorum is back.
func TestClusterRegistryLosesQuorum(t *testing.T) {
	r := startFaultRig(t)
	updates := r.g.metric(`pushlb_list_updates_total{service="orders"}`)
	down := time.Now()
	r.c.Nodes[1].Shutdown()
	r.c.Nodes[2].Shutdown()
	for _, a := range r.anns {
		a.WaitFor(t, "lease refresh failed", 4*clusterLease)
	}
	// The outage goes on for two leases: leases that end during it must
	// not cost a live instance its place.
	testutil.EventuallyWithin(t, 4*clusterLease, "two leases of outage", func() bool { return time.Since(down) > 2*clusterLease })
	r.c.Nodes[1].Restart(t)
	r.c.Nodes[2].Restart(t)
	back := time.Now()
	r.c.WaitJetStream(t)
	ready := time.Now()
	took := r.healed(t, ready)
	t.Logf("quorum lost for %v: JetStream back %v after the nodes restarted, registry and lists right %v after that; the list changed %v times",
		back.Sub(down).Round(time.Millisecond), ready.Sub(back).Round(time.Millisecond), took.Round(time.Millisecond), r.g.metric(`pushlb_list_updates_total{service="orders"}`)-updates)
}

// churn replaces instances of the rig one at a time: it announces a new
// one, then stops (SIGTERM: offline, deregistration) the oldest live one,
// n times; between steps it calls between(step) (nil: nothing).
func (r *faultRig) churn(t *testing.T, n int, between func(step int)) {
	t.Helper()
	for step := range n {
		if between != nil {
			between(step)
		}
		b := newTracked(t, fmt.Sprintf("c%02d", step))
		a := announceOn(t, r.c.URL(), b)
		a.WaitFor(t, "announced online", lineTimeout)
		r.backends, r.anns = append(r.backends, b), append(r.anns, a)
		r.live = append(r.live, b.name)
		old := r.anns[0]
		if code := old.Stop(t, exitTimeout); code != 0 {
			t.Fatalf("announce %s exited %d", r.backends[0].name, code)
		}
		name := r.backends[0].name
		r.live = slices.DeleteFunc(r.live, func(id string) bool { return id == name })
		testutil.Eventually(t, name+" out of the load's gateway's list", func() bool { return !slices.Contains(r.lg.ids(t), name) })
		r.gone = append(r.gone, goneInstance{b: r.backends[0], hits: r.backends[0].hits.Load()})
		r.backends, r.anns = r.backends[1:], r.anns[1:]
	}
	slices.Sort(r.live)
}

// TestClusterLeaderKilledDuringChurn: instances are replaced one after the
// other while the node leading the registry stream is killed (and comes
// back later): announcers and the gateway fail over to the other nodes,
// whose replicas elect a new leader. No request fails, and the registry
// and the gateway's lists hold exactly the live instances once the churn
// is over.
func TestClusterLeaderKilledDuringChurn(t *testing.T) {
	r := startFaultRig(t)
	var leader *natstest.Server
	testutil.Eventually(t, "a registry stream leader", func() bool {
		leader = r.c.StreamLeader("KV_pushlb_lb")
		return leader != nil
	})
	var killed time.Time
	r.churn(t, 6, func(step int) {
		switch step {
		case 2:
			leader.Shutdown()
			killed = time.Now()
		case 5:
			leader.Restart(t)
		}
	})
	r.c.WaitJetStream(t)
	took := r.healed(t, killed)
	t.Logf("leader killed during churn: registry and lists right %v after the kill (6 replacements, the node back after 3)", took.Round(time.Millisecond))
}

// TestGatewayRestartedDuringChurn: two gateways; instances are replaced
// one after the other while the first gateway restarts, and the load goes
// through the second. No request fails; the restarted gateway lists
// exactly the live instances once the churn is over.
func TestGatewayRestartedDuringChurn(t *testing.T) {
	r := startFaultRig(t)
	first := r.g
	second := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	second.Proc = start(t, bin.gateway, "-listen", second.proxy, "-admin", second.admin, "-nats", r.c.URL(), "-follow", "all")
	testutil.Eventually(t, "the second gateway to list every instance", func() bool { return slices.Equal(second.ids(t), r.live) })
	r.l.stop()
	r.l, r.lg = startLoad(second, loadWorkers), second
	t.Cleanup(r.l.stop)
	r.l.waitMore(t, 100)
	var restarted time.Time
	r.churn(t, 4, func(step int) {
		switch step {
		case 1:
			if code := first.Stop(t, exitTimeout); code != 0 {
				t.Fatalf("the first gateway exited %d", code)
			}
		case 2:
			first.Proc = start(t, bin.gateway, "-listen", first.proxy, "-admin", first.admin, "-nats", r.c.URL(), "-follow", "all")
			restarted = time.Now()
		}
	})
	r.g = second
	took := r.healed(t, restarted)
	testutil.Eventually(t, "the restarted gateway to list every live instance", func() bool { return slices.Equal(first.ids(t), r.live) })
	t.Logf("gateway restarted during churn: both gateways right %v after its restart", took.Round(time.Millisecond))
}

// TestClusterNodePaused: the node that the gateway and one announcer are
// connected to stops answering (as a SIGSTOPped server, or a dead link:
// its connections stay open, nothing gets through, new connections hang),
// for as long as their pings take to notice; then it resumes. Both fail
// over to the other nodes: the gateway resyncs, the announcer announces
// again before its lease ends. No request fails, no live instance leaves
// the list, and the registry and the list are right afterwards.
func TestClusterNodePaused(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	paused := natstest.NewLink(t, strings.TrimPrefix(c.Nodes[0].URL(), "nats://"))
	const lease = 6 * time.Second // pings every lease/5: noticed in 2.4-3.6 s
	r := &faultRig{c: c}
	r.g = &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	// Given only the paused node's address, each learns the others from
	// the cluster, as TestClusterNodeLoss's announcers do.
	r.g.Proc = start(t, bin.gateway, "-listen", r.g.proxy, "-admin", r.g.admin, "-nats", paused.URL(), "-follow", "all", "-lease", lease.String())
	r.g.waitHealthy(t)
	for i, url := range []string{paused.URL(), c.Nodes[1].URL(), c.Nodes[2].URL()} {
		b := newTracked(t, fmt.Sprintf("i%d", i+1))
		r.backends, r.anns = append(r.backends, b), append(r.anns, announceOn(t, url, b))
		r.live = append(r.live, b.name)
	}
	testutil.Eventually(t, "three instances listed", func() bool { return slices.Equal(r.g.ids(t), r.live) })
	r.l, r.lg = startLoad(r.g, loadWorkers), r.g
	t.Cleanup(r.l.stop)
	r.l.waitMore(t, 100)
	updates := r.g.metric(`pushlb_list_updates_total{service="orders"}`)

	froze := time.Now()
	if n := paused.Pause(); n < 2 {
		t.Fatalf("%d connections frozen, want the gateway's and the announcer's", n)
	}
	r.g.WaitFor(t, "reconnected to NATS", 4*lease)
	r.anns[0].WaitFor(t, "re-announced", 4*lease)
	noticed := time.Since(froze)
	paused.Resume()
	took := r.healed(t, froze)
	t.Logf("node paused: the gateway and the announcer failed over within %v; registry and list right %v after the pause began; the list changed %v times",
		noticed.Round(time.Millisecond), took.Round(time.Millisecond), r.g.metric(`pushlb_list_updates_total{service="orders"}`)-updates)
	if d := r.g.metric(`pushlb_list_updates_total{service="orders"}`) - updates; d != 0 {
		t.Errorf("the list changed %v times during the pause, want 0: a live instance left it", d)
	}
}

// TestPublisherLinkCut: the link between one announcer and its node dies
// (its connection stays open, nothing gets through) while its backend
// keeps serving, then works again. The announcer's pings notice, it
// connects again and announces again before its lease ends: no request
// fails, the instance never leaves the list.
func TestPublisherLinkCut(t *testing.T) {
	r := startFaultRig(t)
	cut := natstest.NewLink(t, strings.TrimPrefix(r.c.Nodes[0].URL(), "nats://"))
	b := newTracked(t, "linked")
	a := announceOn(t, cut.URL(), b)
	a.WaitFor(t, "announced online", lineTimeout)
	r.backends, r.anns = append(r.backends, b), append(r.anns, a)
	r.live = append(r.live, b.name)
	slices.Sort(r.live)
	testutil.Eventually(t, "the linked instance listed", func() bool { return slices.Equal(r.g.ids(t), r.live) })
	updates := r.g.metric(`pushlb_list_updates_total{service="orders"}`)

	froze := time.Now()
	if n := cut.Freeze(); n < 1 {
		t.Fatalf("%d connections frozen, want the announcer's", n)
	}
	a.WaitFor(t, "re-announced", 4*clusterLease)
	took := r.healed(t, froze)
	t.Logf("a publisher's link cut: re-announced and right %v after the cut; the list changed %v times",
		took.Round(time.Millisecond), r.g.metric(`pushlb_list_updates_total{service="orders"}`)-updates)
	if d := r.g.metric(`pushlb_list_updates_total{service="orders"}`) - updates; d != 0 {
		t.Errorf("the list changed %v times, want 0: the live instance left it", d)
	}
}
