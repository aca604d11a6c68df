package serverlist_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// lead runs rep's Lead until the end of the test (as a reaper's leader
// would) and waits for it there.
func lead(t *testing.T, rep *serverlist.Replicator) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rep.Lead(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func newReplicator(t *testing.T, reg *serverlist.Registry, region string, remotes ...serverlist.RemoteRegion) *serverlist.Replicator {
	t.Helper()
	rep, err := serverlist.NewReplicator(reg, serverlist.ReplicatorConfig{Region: region, Remotes: remotes, Probe: 50 * time.Millisecond, StatusInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// openBucket opens another registry bucket on e's server: another region's
// registry where regions share one JetStream domain (a supercluster).
func (e *env) openBucket(t *testing.T, bucket string) *serverlist.Registry {
	t.Helper()
	reg, err := serverlist.Open(testCtx(t, 10*time.Second), e.js, serverlist.RegistryConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func waitInstance(t *testing.T, m *serverlist.Mirror, what, service, id string, ok func(serverlist.Instance, bool) bool) {
	t.Helper()
	testutil.Eventually(t, what, func() bool {
		in, held := m.Get(service, id)
		return ok(in, held)
	})
}

// TestReplicatorCopiesAnotherRegion: eu's records reach us's registry as
// read-only copies (qualified IDs, the region, no connection, no gossip
// node): added, changed, marked down, removed; eu's own copies of other
// regions are not copied again; us's status key says eu is linked.
func TestReplicatorCopiesAnotherRegion(t *testing.T) {
	us := newEnv(t, serverlist.RegistryConfig{Bucket: "reg_us"})
	eu := us.openBucket(t, "reg_eu")
	a, b := inst("orders", "a", 1001), inst("orders", "b", 1002)
	a.NATSServerID, a.NATSClientID, a.GossipNode, a.GossipAddr = "NSRV", 7, "orders/a/1", "127.0.0.1:7946"
	register(t, eu, a, b)
	// A copy eu holds of another region: eu's replicator's, not eu's own.
	ap := inst("orders", "c@ap", 1003)
	ap.Region = "ap"
	ctx := testCtx(t, 5*time.Second)
	if err := us.js.Conn().Publish("$KV.reg_eu."+mustRegionalKey(t, "orders", "ap", "c"), mustJSON(t, ap)); err != nil {
		t.Fatal(err)
	}

	m := startMirror(t, us.reg, serverlist.MirrorConfig{})
	rep := newReplicator(t, us.reg, "us", serverlist.RemoteRegion{Name: "eu", Bucket: "reg_eu"})
	lead(t, rep)

	waitInstance(t, m, "eu's a copied", "orders", "a@eu", func(in serverlist.Instance, ok bool) bool { return ok })
	got, _ := m.Get("orders", "a@eu")
	if got.Region != "eu" || got.Port != 1001 || got.NATSServerID != "" || got.NATSClientID != 0 || got.GossipNode != "" || got.GossipAddr != "" {
		t.Fatalf("copy of a: %+v", got)
	}
	waitInstance(t, m, "eu's b copied", "orders", "b@eu", func(in serverlist.Instance, ok bool) bool { return ok })

	a.Weight = 500
	register(t, eu, a)
	waitInstance(t, m, "a's new weight copied", "orders", "a@eu", func(in serverlist.Instance, ok bool) bool { return ok && in.Weight == 500 })

	b.Status = serverlist.StatusDown
	register(t, eu, b)
	waitInstance(t, m, "b marked down: gone", "orders", "b@eu", func(in serverlist.Instance, ok bool) bool { return !ok })
	b.Status = ""
	register(t, eu, b)
	waitInstance(t, m, "b back", "orders", "b@eu", func(in serverlist.Instance, ok bool) bool { return ok })

	if err := eu.Deregister(ctx, "orders", "a"); err != nil {
		t.Fatal(err)
	}
	waitInstance(t, m, "a's removal copied", "orders", "a@eu", func(in serverlist.Instance, ok bool) bool { return !ok })

	testutil.Eventually(t, "eu linked in us's status", func() bool {
		st := rep.Stats()
		return len(st.Remotes) == 1 && st.Remotes[0].Linked && st.Remotes[0].Copies == 1
	})
	if _, ok := m.Get("orders", "c@ap@eu"); ok {
		t.Fatal("eu's copy of ap's record was copied again")
	}
	if st := rep.Stats().Remotes[0]; st.Written < 4 || st.Removed < 2 {
		t.Fatalf("stats: %+v", st)
	}
	// The region's records are read through a bounded watch (a pull
	// consumer), not KeyValue.Watch's push consumer, which lets the
	// region's server send up to 32 MiB ahead of the copies written.
	stream, err := us.js.Stream(ctx, "KV_reg_eu")
	if err != nil {
		t.Fatal(err)
	}
	watches := 0
	for info := range stream.ListConsumers(ctx).Info() {
		if info.Config.FilterSubject != "$KV.reg_eu."+serverlist.RecordKeys {
			continue
		}
		watches++
		if info.Config.DeliverSubject != "" {
			t.Errorf("the region's records are watched by a push consumer (%s): not bounded", info.Name)
		}
	}
	if watches == 0 {
		t.Fatal("no watch of eu's records: the session's is missing")
	}
	w := serverlist.WatchRegions(t.Context(), us.reg, 200*time.Millisecond, zerolog.Nop())
	defer w.Close()
	testutil.Eventually(t, "the status watch to see eu linked", func() bool {
		v := w.Regions()
		return len(v) == 1 && v[0].Region == "eu" && v[0].Linked && !v[0].Stale && v[0].Copies == 1
	})
}

// TestReplicatorResyncs: a replicator that starts (a new leader) over
// copies written by an earlier one removes those of records gone
// meanwhile and writes only what changed; copies of a region no longer
// configured are removed.
func TestReplicatorResyncs(t *testing.T) {
	us := newEnv(t, serverlist.RegistryConfig{Bucket: "reg_us"})
	eu := us.openBucket(t, "reg_eu")
	ap := us.openBucket(t, "reg_ap")
	register(t, eu, inst("orders", "a", 1001), inst("orders", "b", 1002))
	register(t, ap, inst("orders", "a", 2001))
	m := startMirror(t, us.reg, serverlist.MirrorConfig{})

	first := newReplicator(t, us.reg, "us", serverlist.RemoteRegion{Name: "eu", Bucket: "reg_eu"}, serverlist.RemoteRegion{Name: "ap", Bucket: "reg_ap"})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { first.Lead(ctx) })
	waitInstance(t, m, "ap's a copied", "orders", "a@ap", func(in serverlist.Instance, ok bool) bool { return ok })
	waitInstance(t, m, "eu's b copied", "orders", "b@eu", func(in serverlist.Instance, ok bool) bool { return ok })
	cancel()
	wg.Wait()

	if err := eu.Deregister(testCtx(t, 5*time.Second), "orders", "b"); err != nil {
		t.Fatal(err)
	}
	second := newReplicator(t, us.reg, "us", serverlist.RemoteRegion{Name: "eu", Bucket: "reg_eu"})
	lead(t, second)
	waitInstance(t, m, "eu's b, gone while no replicator ran, removed", "orders", "b@eu", func(in serverlist.Instance, ok bool) bool { return !ok })
	waitInstance(t, m, "ap's copies removed (ap no longer configured)", "orders", "a@ap", func(in serverlist.Instance, ok bool) bool { return !ok })
	if _, ok := m.Get("orders", "a@eu"); !ok {
		t.Fatal("eu's a lost")
	}
	testutil.Eventually(t, "the second term's stats", func() bool {
		st := second.Stats()
		return st.Forgotten == 1 && st.Remotes[0].Linked
	})
	if st := second.Stats().Remotes[0]; st.Written != 0 || st.Removed != 1 || st.Copies != 1 {
		t.Fatalf("the second term rewrote copies it held: %+v", st)
	}
}

// TestCopyNeverDisplacesAnOwnRecord: an own record whose ID is a copy's
// qualified ID ("a@eu" registered in us, eu's "a" copied) is kept, and
// the collision counted.
func TestCopyNeverDisplacesAnOwnRecord(t *testing.T) {
	us := newEnv(t, serverlist.RegistryConfig{Bucket: "reg_us"})
	eu := us.openBucket(t, "reg_eu")
	own := inst("orders", "a@eu", 3001)
	register(t, us.reg, own)
	m := startMirror(t, us.reg, serverlist.MirrorConfig{})
	register(t, eu, inst("orders", "a", 1001))
	lead(t, newReplicator(t, us.reg, "us", serverlist.RemoteRegion{Name: "eu", Bucket: "reg_eu"}))
	testutil.Eventually(t, "the collision counted", func() bool { return m.Stats().Collisions == 1 })
	if got, _ := m.Get("orders", "a@eu"); got.Port != 3001 {
		t.Fatalf("the own record was displaced: %+v", got)
	}
	if err := eu.Deregister(testCtx(t, 5*time.Second), "orders", "a"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the copy's removal applied", func() bool { return m.Stats().Removals >= 1 })
	if got, ok := m.Get("orders", "a@eu"); !ok || got.Port != 3001 {
		t.Fatalf("the copy's removal removed the own record: %+v %v", got, ok)
	}
}

// TestReaperNeverReapsACopy: copies have no lease in this region; the
// reaper's sweeps, listed and mirrored, leave them alone.
func TestReaperNeverReapsACopy(t *testing.T) {
	for _, mirrored := range []bool{false, true} {
		t.Run(map[bool]string{false: "listed", true: "mirrored"}[mirrored], func(t *testing.T) {
			us := newEnv(t, serverlist.RegistryConfig{Bucket: "reg_us", TTL: time.Second})
			eu := us.openBucket(t, "reg_eu")
			register(t, eu, inst("orders", "a", 1001))
			rep := newReplicator(t, us.reg, "us", serverlist.RemoteRegion{Name: "eu", Bucket: "reg_eu"})
			m := startMirror(t, us.reg, serverlist.MirrorConfig{})
			cfg := serverlist.ReaperConfig{SweepInterval: 100 * time.Millisecond, Logger: zerolog.Nop(), OnLead: rep.Lead}
			if mirrored {
				cfg.Mirror = m
			}
			reaper := startReaper(t, us.reg, cfg)
			waitInstance(t, m, "eu's a copied", "orders", "a@eu", func(in serverlist.Instance, ok bool) bool { return ok })
			// A copy would be removed at its second sweep without a lease.
			sweeps := reaper.Stats().Sweeps
			testutil.Eventually(t, "three more sweeps", func() bool { return reaper.Stats().Sweeps >= sweeps+3 })
			if _, ok := m.Get("orders", "a@eu"); !ok {
				t.Fatal("the reaper removed a copy")
			}
			if st := reaper.Stats(); st.Reaped != 0 {
				t.Fatalf("reaped %d", st.Reaped)
			}
		})
	}
}

func TestReplicatorConfigErrors(t *testing.T) {
	for name, cfg := range map[string]serverlist.ReplicatorConfig{
		"no region":    {Remotes: []serverlist.RemoteRegion{{Name: "eu"}}},
		"own region":   {Region: "us", Remotes: []serverlist.RemoteRegion{{Name: "us"}}},
		"twice":        {Region: "us", Remotes: []serverlist.RemoteRegion{{Name: "eu"}, {Name: "eu"}}},
		"invalid name": {Region: "us", Remotes: []serverlist.RemoteRegion{{Name: "e.u"}}},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func mustRegionalKey(t *testing.T, service, region, id string) string {
	t.Helper()
	key, err := serverlist.EncodeRegionalKey(service, region, id)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// openIn opens region name's registry (bucket "pushlb_lb") on its server.
func openIn(t *testing.T, rs *natstest.Regions, name string) *serverlist.Registry {
	t.Helper()
	js := mustJetStream(t, rs.Connect(t, name))
	reg, err := serverlist.Open(testCtx(t, 10*time.Second), js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestReplicationAcrossALeafLink: two regions, each its own server and
// JetStream domain, us a leaf node of eu. us's registry copies eu's
// records through eu's domain; while the link is cut us keeps its copies
// and its status says eu is cut; eu's changes during the cut (an
// instance gone, one added) reach us once the link is back.
func TestReplicationAcrossALeafLink(t *testing.T) {
	rs := natstest.StartRegions(t, "eu", "us")
	eu, us := openIn(t, rs, "eu"), openIn(t, rs, "us")
	register(t, eu, inst("orders", "a", 1001), inst("orders", "b", 1002))
	register(t, us, inst("orders", "x", 2001))
	m := startMirror(t, us, serverlist.MirrorConfig{})
	rep := newReplicator(t, us, "us", serverlist.RemoteRegion{Name: "eu", Domain: "eu"})
	lead(t, rep)
	w := serverlist.WatchRegions(t.Context(), us, 200*time.Millisecond, zerolog.Nop())
	defer w.Close()

	waitInstance(t, m, "eu's a copied", "orders", "a@eu", func(_ serverlist.Instance, ok bool) bool { return ok })
	waitInstance(t, m, "eu's b copied", "orders", "b@eu", func(_ serverlist.Instance, ok bool) bool { return ok })
	linked := func(want bool) func() bool {
		return func() bool {
			v := w.Regions()
			return len(v) == 1 && v[0].Linked == want && v[0].Stale == !want
		}
	}
	testutil.Eventually(t, "eu linked", linked(true))

	rs.Cut(t, "us")
	cutAt := time.Now()
	testutil.EventuallyWithin(t, 30*time.Second, "eu marked cut", linked(false))
	t.Logf("eu marked cut %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	cuts := rep.Stats().Remotes[0].Cuts
	if err := eu.Deregister(testCtx(t, 5*time.Second), "orders", "a"); err != nil {
		t.Fatal(err)
	}
	register(t, eu, inst("orders", "c", 1003))
	for _, id := range []string{"a@eu", "b@eu", "x"} {
		if _, ok := m.Get("orders", id); !ok {
			t.Fatalf("%s lost during the cut", id)
		}
	}

	healAt := time.Now()
	rs.Heal(t, "us")
	t.Logf("the link carries messages %v after the heal", time.Since(healAt).Round(time.Millisecond))
	waitInstance(t, m, "eu's a, gone during the cut, removed", "orders", "a@eu", func(_ serverlist.Instance, ok bool) bool { return !ok })
	waitInstance(t, m, "eu's c, added during the cut, copied", "orders", "c@eu", func(_ serverlist.Instance, ok bool) bool { return ok })
	t.Logf("us's copies right %v after the heal", time.Since(healAt).Round(time.Millisecond))
	testutil.Eventually(t, "eu linked again", linked(true))
	if st := rep.Stats().Remotes[0]; st.Cuts != cuts || st.Resyncs < 2 {
		t.Fatalf("stats: %+v (cuts before the heal %d)", st, cuts)
	}
}

// TestTwoReplicatorsAtOnce: during a hand-over two replicators may lead
// for a moment; their conditional writes keep the copies right whichever
// wins each write.
func TestTwoReplicatorsAtOnce(t *testing.T) {
	us := newEnv(t, serverlist.RegistryConfig{Bucket: "reg_us"})
	eu := us.openBucket(t, "reg_eu")
	m := startMirror(t, us.reg, serverlist.MirrorConfig{})
	lead(t, newReplicator(t, us.reg, "us", serverlist.RemoteRegion{Name: "eu", Bucket: "reg_eu"}))
	lead(t, newReplicator(t, us.reg, "us", serverlist.RemoteRegion{Name: "eu", Bucket: "reg_eu"}))
	ctx := testCtx(t, 20*time.Second)
	for i := range 40 {
		in := inst("orders", "a", 1000+i)
		register(t, eu, in)
		if i%3 == 0 {
			if err := eu.Deregister(ctx, "orders", "a"); err != nil {
				t.Fatal(err)
			}
		}
	}
	register(t, eu, inst("orders", "a", 2000), inst("orders", "b", 2001))
	waitInstance(t, m, "a's last write copied", "orders", "a@eu", func(in serverlist.Instance, ok bool) bool { return ok && in.Port == 2000 })
	waitInstance(t, m, "b copied", "orders", "b@eu", func(in serverlist.Instance, ok bool) bool { return ok && in.Port == 2001 })
	if err := eu.Deregister(ctx, "orders", "b"); err != nil {
		t.Fatal(err)
	}
	waitInstance(t, m, "b's removal copied", "orders", "b@eu", func(_ serverlist.Instance, ok bool) bool { return !ok })
}
