package regionbench_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/app/natsaccounts"
	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

const (
	// service is the service the instances of every benchmark announce.
	service = "svc"
	// exitTimeout bounds the exit of a SIGTERMed announce.
	exitTimeout = 15 * time.Second
	// waitTimeout bounds every wait for a state the system should reach.
	waitTimeout = time.Minute
)

var (
	// built builds the gateway, announce and nats-server binaries on
	// first use (a run without these benchmarks builds nothing).
	built = testutil.NewLazyBinaries("../../../cmd/gateway", "../../../cmd/announce", natsproc.Module)
	bins  struct{ gateway, announce, nats string }
)

func TestMain(m *testing.M) {
	code := m.Run()
	built.Remove()
	if code == 0 {
		if err := goleak.Find(natstest.IgnoreServerGoroutines()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// binaries sets bins, building the binaries once per run.
func binaries(tb testing.TB) {
	tb.Helper()
	paths := built.Paths(tb)
	bins.gateway, bins.announce, bins.nats = paths[0], paths[1], paths[2]
}

// BenchmarkRegionChange: a record change in another region until a
// client in region b has it in its list, beside the raw NATS hop over the
// same link (doc.go). Per source region s (a; with three regions also c,
// a leaf node like b, so through the hub), the metrics named sb-...:
//   - hop-p50/p99-µs: a plain publish in s until a subscriber in b has it;
//   - change-p50/p99-µs: a Register or a Deregister through serverlist in
//     s until the ListObserver of a pushlb.Client in b (Region "b",
//     FollowAll) hears the copy join or leave; a gateway process in b
//     replicates (its reaper leads: it is alone);
//   - copy-p50/p99-µs: the same change until a watch of b's bucket sees
//     the copy written or removed (the replication alone, before the
//     client's mirror and list build);
//   - p50-x, p99-x: change over hop, the goal being p99-x ≤ 2;
//   - extra-p50/p99-µs: change minus hop (each quantile apart), what the
//     way across costs beyond the link: the write in s, the replicator's
//     copy written in b, the watches that carry both, the list build.
//     Over a link of round trip RTT the ratio is about
//     (RTT/2 + extra) / (RTT/2): on loopback the hop is as cheap as a
//     local JetStream write, so the ratio shows the writes.
//
// Each change is preceded by a hop, so both see the same moments of the
// run. The changes go round servicesPerRegion services per source region
// (each with an instance that stays): in each, a new instance registered,
// the next round deregistered.
func BenchmarkRegionChange(b *testing.B) {
	for _, n := range []int{2, 3} {
		b.Run(fmt.Sprintf("regions=%d", n), func(b *testing.B) {
			for b.Loop() {
				regionChange(b, n)
			}
		})
	}
}

func regionChange(b *testing.B, regions int) {
	binaries(b)
	changes := 320 // 20 rounds of the services
	if testing.Short() {
		changes = 2 * servicesPerRegion
	}
	names := []string{"a", "b", "c"}[:regions]
	sources := []string{"a"}
	if regions == 3 {
		sources = append(sources, "c")
	}
	r := natsproc.StartRegions(b, bins.nats, names...)
	ctx := b.Context()

	// The source regions' registries, made with a lease that no record of
	// the run outlives (no announce refreshes them, no reaper runs there).
	regs := map[string]*serverlist.Registry{}
	for _, s := range sources {
		js, err := jetstream.New(r.Connect(b, s))
		if err != nil {
			b.Fatal(err)
		}
		var reg *serverlist.Registry
		testutil.EventuallyWithin(b, waitTimeout, "region "+s+"'s registry", func() bool {
			reg, err = serverlist.Open(ctx, js, serverlist.RegistryConfig{TTL: 10 * time.Minute})
			return err == nil
		})
		regs[s] = reg
	}
	hc := newHTTPClient(b)
	startGateway(b, hc, r, "b", sources...)

	seen := newArrivals()
	ncB := r.Connect(b, "b")
	client, err := pushlb.New(ncB, pushlb.Config{Region: "b", Follow: pushlb.FollowAll},
		pushlb.WithLogger(zerolog.Nop()),
		pushlb.WithListObserver(func(lc pushlb.ListChange) {
			now := time.Now()
			for _, j := range lc.Joined {
				seen.note("join "+lc.Service+"/"+j.Server.ID, now)
			}
			for _, l := range lc.Left {
				seen.note("leave "+lc.Service+"/"+l.Server.ID, now)
			}
		}))
	if err != nil {
		b.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	stopCopies := watchCopies(b, ncB, seen)
	defer stopCopies()

	// The hops: a subscriber in b, a publisher in each source region, on
	// connections of their own.
	hopSub := r.Connect(b, "b")
	subs, pubs := map[string]*nats.Subscription{}, map[string]*nats.Conn{}
	for _, s := range sources {
		sub, err := hopSub.SubscribeSync("bench.hop." + s)
		if err != nil {
			b.Fatal(err)
		}
		subs[s], pubs[s] = sub, r.Connect(b, s)
	}
	if err := hopSub.Flush(); err != nil {
		b.Fatal(err)
	}
	seq := 0
	crosses := func(s string, timeout time.Duration) (time.Duration, bool) {
		seq++
		v := strconv.Itoa(seq)
		t0 := time.Now()
		if err := pubs[s].Publish("bench.hop."+s, []byte(v)); err != nil {
			b.Fatal(err)
		}
		for {
			m, err := subs[s].NextMsg(timeout)
			if err != nil {
				return 0, false
			}
			if string(m.Data) == v {
				return time.Since(t0), true
			}
		}
	}

	// Warm-up: the link carries publishes, and the replication runs (a
	// first instance of each service listed in b). The instances come
	// and go in servicesPerRegion services per source region, in turn, so
	// that a service changes again long after its last list was built:
	// the client coalesces a service's changes within 10 ms
	// (Config.Coalesce), which changes made one after another in the same
	// service would measure instead of the way across.
	svc := func(s string, i int) string { return fmt.Sprintf("%s-%s-%d", service, s, i%servicesPerRegion) }
	for _, s := range sources {
		testutil.EventuallyWithin(b, waitTimeout, "a publish from "+s+" to cross to b", func() bool {
			_, ok := crosses(s, 50*time.Millisecond)
			return ok
		})
		for k := range servicesPerRegion {
			if _, err := regs[s].Register(ctx, instance(svc(s, k), "base", 1)); err != nil {
				b.Fatal(err)
			}
		}
		for k := range servicesPerRegion {
			if _, ok := seen.wait("join "+svc(s, k)+"/"+serverlist.QualifiedID("base", s), waitTimeout); !ok {
				b.Fatalf("region %s's first instance of %s never reached b's client", s, svc(s, k))
			}
		}
	}

	type figures struct{ hop, change, copied []time.Duration }
	res := map[string]*figures{}
	for _, s := range sources {
		res[s] = &figures{}
	}
	for i := range changes {
		for _, s := range sources {
			f := res[s]
			d, ok := crosses(s, 5*time.Second)
			if !ok {
				b.Fatalf("a publish from %s did not cross to b", s)
			}
			f.hop = append(f.hop, d)

			// Round r registers x<r> in each service, round r+1
			// deregisters it.
			round := i / servicesPerRegion
			name, id := svc(s, i), "x"+strconv.Itoa(round/2)
			qid := serverlist.QualifiedID(id, s)
			key, err := serverlist.EncodeRegionalKey(name, s, id)
			if err != nil {
				b.Fatal(err)
			}
			listed, copied := "join "+name+"/"+qid, "put "+key
			t0 := time.Now()
			if round%2 == 0 {
				_, err = regs[s].Register(ctx, instance(name, id, int64(i+2)))
			} else {
				listed, copied = "leave "+name+"/"+qid, "del "+key
				err = regs[s].Deregister(ctx, name, id)
			}
			if err != nil {
				b.Fatal(err)
			}
			at, ok := seen.wait(listed, 10*time.Second)
			if !ok {
				b.Fatalf("change %d of %s (%s) never reached b's client", i, s, listed)
			}
			f.change = append(f.change, at.Sub(t0))
			at, ok = seen.wait(copied, 10*time.Second)
			if !ok {
				b.Fatalf("change %d of %s: b's bucket never saw %s", i, s, copied)
			}
			f.copied = append(f.copied, at.Sub(t0))
		}
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	for _, s := range sources {
		f, p := res[s], s+"b-"
		hop50, hop99 := testutil.Percentile(f.hop, .5), testutil.Percentile(f.hop, .99)
		ch50, ch99 := testutil.Percentile(f.change, .5), testutil.Percentile(f.change, .99)
		b.ReportMetric(us(hop50), p+"hop-p50-µs")
		b.ReportMetric(us(hop99), p+"hop-p99-µs")
		b.ReportMetric(us(ch50), p+"change-p50-µs")
		b.ReportMetric(us(ch99), p+"change-p99-µs")
		b.ReportMetric(us(testutil.Percentile(f.copied, .5)), p+"copy-p50-µs")
		b.ReportMetric(us(testutil.Percentile(f.copied, .99)), p+"copy-p99-µs")
		b.ReportMetric(us(ch50-hop50), p+"extra-p50-µs")
		b.ReportMetric(us(ch99-hop99), p+"extra-p99-µs")
		b.ReportMetric(float64(ch50)/float64(hop50), p+"p50-x")
		b.ReportMetric(float64(ch99)/float64(hop99), p+"p99-x")
	}
	b.ReportMetric(float64(changes), "changes/region")
}

// servicesPerRegion is how many services the changes of
// BenchmarkRegionChange go round, per source region.
const servicesPerRegion = 16

// instance is a record in a source region of BenchmarkRegionChange:
// nobody dials it.
func instance(service, id string, incarnation int64) serverlist.Instance {
	return serverlist.Instance{Service: service, InstanceID: id, Host: "127.0.0.1", Port: 9, Incarnation: incarnation}
}

// watchCopies notes every write to b's registry bucket ("put <key>",
// "del <key>") in seen, until the returned function is called.
func watchCopies(b *testing.B, nc *nats.Conn, seen *arrivals) (stop func()) {
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	kv, err := js.KeyValue(b.Context(), serverlist.BucketName(events.DefaultPrefix))
	if err != nil {
		b.Fatal(err)
	}
	w, err := kv.WatchAll(b.Context(), jetstream.UpdatesOnly())
	if err != nil {
		b.Fatal(err)
	}
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-done:
				return
			case e := <-w.Updates():
				if e == nil {
					continue
				}
				op := "put "
				if e.Operation() != jetstream.KeyValuePut {
					op = "del "
				}
				seen.note(op+e.Key(), time.Now())
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			w.Stop()
			close(done)
			<-ended
		})
	}
}

// arrivals keeps when each named event was first seen, for waiters.
type arrivals struct {
	mu      sync.Mutex
	at      map[string]time.Time
	changed chan struct{} // closed and replaced at each note
}

func newArrivals() *arrivals {
	return &arrivals{at: map[string]time.Time{}, changed: make(chan struct{})}
}

func (a *arrivals) note(key string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.at[key]; !ok {
		a.at[key] = at
	}
	close(a.changed)
	a.changed = make(chan struct{})
}

// wait returns when key was first noted, waiting up to timeout for it.
func (a *arrivals) wait(key string, timeout time.Duration) (time.Time, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		at, ok := a.at[key]
		changed := a.changed
		a.mu.Unlock()
		if ok {
			return at, true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return time.Time{}, false
		}
	}
}

// BenchmarkRegionFailover: region a has two instances of the service, b
// one; a gateway in a (-region a -remote-region b) under a steady load
// (four clients, the gateway's default retries). Each repetition
// withdraws a's first instance (requests stay in a), then its last, and
// measures from the withdrawal to the first request b's instance serves;
// then announces both again and waits until a serves every request. The
// servers run pushlb's accounts (disconnect advisories), so that a crash
// is found as in production. Reported:
//   - graceful-p50/max-ms: the last instance's announce SIGTERMed
//     (offline event, record removed), its backend still up;
//   - crash-p50/max-ms: its announce SIGKILLed and its backend closed;
//     crash-gone-p50/max-ms: until the gateway's list dropped it;
//   - failed: requests that failed (goal 0), of requests;
//   - spilled: requests b served while a still had an instance (0).
func BenchmarkRegionFailover(b *testing.B) {
	graceful, crashes := 10, 10
	if testing.Short() {
		graceful, crashes = 1, 1
	}
	for b.Loop() {
		regionFailover(b, graceful, crashes)
	}
}

func regionFailover(b *testing.B, graceful, crashes int) {
	binaries(b)
	accounts, err := natsaccounts.Config(events.DefaultPrefix)
	if err != nil {
		b.Fatal(err)
	}
	r := natsproc.StartRegionsWith(b, bins.nats, natsproc.RegionsConfig{Extra: accounts, Account: natsaccounts.Account}, "a", "b")
	hc := newHTTPClient(b)
	g := startGateway(b, hc, r, "a", "b")
	far := newBackend(b, "b-1")
	announce(b, r, "b", far)
	first, last := newBackend(b, "a-1"), newBackend(b, "a-2")
	annFirst, annLast := announce(b, r, "a", first), announce(b, r, "a", last)
	waitIDs(b, g, "a-1", "a-2", "b-1@b")
	l := startLoad(b, hc, g, 4)

	var grace, crash, gone []time.Duration
	var spilled int64
	for i := range graceful + crashes {
		crashing := i >= graceful
		waitServing(b, far, first, last)
		before := far.hits.Load()
		if code := annFirst.Stop(b, exitTimeout); code != 0 {
			b.Fatalf("announce of a-1 exited %d", code)
		}
		waitIDs(b, g, last.id, "b-1@b")
		far.arm()
		spilled += far.hits.Load() - before
		t0 := time.Now()
		if crashing {
			annLast.Kill(b)
			last.close()
		} else if code := annLast.Stop(b, exitTimeout); code != 0 {
			b.Fatalf("announce of %s exited %d", last.id, code)
		}
		testutil.EventuallyWithin(b, waitTimeout, "b's instance to serve a request", func() bool { return far.first.Load() != 0 })
		d := time.Unix(0, far.first.Load()).Sub(t0)
		if crashing {
			crash = append(crash, d)
			waitIDs(b, g, "b-1@b")
			gone = append(gone, time.Since(t0))
			// A crashed instance comes back as a new one.
			last = newBackend(b, fmt.Sprintf("a-c%d", i))
		} else {
			grace = append(grace, d)
		}
		far.disarm()
		annFirst, annLast = announce(b, r, "a", first), announce(b, r, "a", last)
		waitIDs(b, g, "a-1", last.id, "b-1@b")
	}
	l.halt()

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	report := func(name string, d []time.Duration) {
		if len(d) == 0 {
			return
		}
		b.ReportMetric(ms(testutil.Percentile(d, .5)), name+"-p50-ms")
		b.ReportMetric(ms(slices.Max(d)), name+"-max-ms")
	}
	report("graceful", grace)
	report("crash", crash)
	report("crash-gone", gone)
	b.ReportMetric(float64(l.failed.Load()), "failed")
	b.ReportMetric(float64(l.sent.Load()), "requests")
	b.ReportMetric(float64(spilled), "spilled")
	if n := l.failed.Load(); n != 0 {
		b.Logf("%d of %d requests failed; the first: %v", n, l.sent.Load(), l.firstErr.Load())
	}
}

// waitServing waits until a's backends (near) served 20 requests while
// b's (far) served none: a routes to its own region again.
func waitServing(b *testing.B, far *backend, near ...*backend) {
	sum := func() (n int64) {
		for _, bk := range near {
			n += bk.hits.Load()
		}
		return n
	}
	farHits, nearHits := far.hits.Load(), sum()
	testutil.EventuallyWithin(b, waitTimeout, "a's instances to serve every request", func() bool {
		if h := far.hits.Load(); h != farHits {
			farHits, nearHits = h, sum()
			return false
		}
		return sum()-nearHits >= 20
	})
}

// BenchmarkRegionLinkCut/regions=2 and /regions=3: regions a (the hub)
// and b (its leaf node), and with three c (another leaf node, with one
// instance), two instances of the service in a and in b, a gateway in
// each region (-remote-region every other) under a steady load (two
// clients each). b's leaf link is cut for 30 s (natsproc.Regions.Cut; the
// servers ping every 2 s, twice, and the leaf node dials again every
// 500 ms, as examples/nats-server/multiregion); during the cut a gains
// an instance (a-3) and loses one (a-1, withdrawn); then the link is
// healed. Reported:
//   - failed: requests that failed through every gateway over the whole
//     run (goal 0: each has local instances), of requests;
//   - stale-a-ms, stale-b-ms: after the cut, until gateway a's /-/lb
//     marked region b stale, and b's a;
//   - view-changed: 1 when b's list of a's instances changed during the
//     cut (it keeps its last view), else 0;
//   - link-back-ms: Heal, until the link carries publishes and each
//     domain's JetStream answers the other region;
//   - list-right-ms: from then until gateway b lists a's instances as
//     they are (a-2@a, a-3@a; goal ≤ 1 s); list-right-total-ms: from the
//     start of Heal;
//   - unstale-ms: from Heal's return until b no longer marks a stale;
//   - c-right-during-cut-ms (three regions): from a's changes until c,
//     still linked to a through the hub, lists them, b being cut.
//
// With -short the link stays cut only until a and b marked each other
// stale and a's changes are made.
func BenchmarkRegionLinkCut(b *testing.B) {
	for _, n := range []int{2, 3} {
		b.Run(fmt.Sprintf("regions=%d", n), func(b *testing.B) {
			for b.Loop() {
				regionLinkCut(b, n)
			}
		})
	}
}

func regionLinkCut(b *testing.B, regions int) {
	binaries(b)
	cfg, hold := natsproc.RegionsConfig{PingInterval: 2 * time.Second, Reconnect: 500 * time.Millisecond}, 30*time.Second
	if testing.Short() {
		cfg, hold = natsproc.RegionsConfig{}, 0
	}
	names := []string{"a", "b", "c"}[:regions]
	r := natsproc.StartRegionsWith(b, bins.nats, cfg, names...)
	hc := newHTTPClient(b)
	others := func(region string) []string {
		return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == region })
	}
	gws := map[string]*gateway{}
	for _, n := range names {
		gws[n] = startGateway(b, hc, r, n, others(n)...)
	}
	ga, gb := gws["a"], gws["b"]
	a1, a2, a3 := newBackend(b, "a-1"), newBackend(b, "a-2"), newBackend(b, "a-3")
	annA1 := announce(b, r, "a", a1)
	announce(b, r, "a", a2)
	announce(b, r, "b", newBackend(b, "b-1"))
	announce(b, r, "b", newBackend(b, "b-2"))
	// The IDs each region's gateway lists: its own instances, the others'
	// copies.
	listed := func(region string, ids map[string][]string) []string {
		var out []string
		for n, is := range ids {
			for _, id := range is {
				if n != region {
					id += "@" + n
				}
				out = append(out, id)
			}
		}
		return out
	}
	ids := map[string][]string{"a": {"a-1", "a-2"}, "b": {"b-1", "b-2"}}
	if regions == 3 {
		announce(b, r, "c", newBackend(b, "c-1"))
		ids["c"] = []string{"c-1"}
	}
	for _, n := range names {
		waitIDs(b, gws[n], listed(n, ids)...)
	}
	testutil.EventuallyWithin(b, waitTimeout, "each gateway to see the other regions linked", func() bool {
		for _, n := range names {
			for _, o := range others(n) {
				if gws[n].stale(o) != 0 {
					return false
				}
			}
		}
		return true
	})
	loads := map[string]*load{}
	for _, n := range names {
		loads[n] = startLoad(b, hc, gws[n], 2)
	}
	viewOfA := func(g *gateway) []string {
		return slices.DeleteFunc(g.ids(), func(id string) bool { return !strings.HasSuffix(id, "@a") })
	}

	r.Cut(b, "b")
	cutAt := time.Now()
	var staleA, staleB time.Duration
	testutil.EventuallyWithin(b, waitTimeout, "a and b to mark each other stale", func() bool {
		if staleA == 0 && ga.stale("b") == 1 {
			staleA = time.Since(cutAt)
		}
		if staleB == 0 && gb.stale("a") == 1 {
			staleB = time.Since(cutAt)
		}
		return staleA != 0 && staleB != 0
	})
	changedAt := time.Now()
	announce(b, r, "a", a3)
	if code := annA1.Stop(b, exitTimeout); code != 0 {
		b.Fatalf("announce of a-1 exited %d", code)
	}
	ids["a"] = []string{"a-2", "a-3"}
	waitIDs(b, ga, listed("a", ids)...)
	// A region the cut leaves linked to a (c, through the hub) follows
	// a's changes meanwhile.
	var otherRight time.Duration
	if regions == 3 {
		waitIDs(b, gws["c"], listed("c", ids)...)
		otherRight = time.Since(changedAt)
		if gws["c"].stale("a") != 0 {
			b.Fatal("c marked a stale while only b was cut")
		}
	}
	// The cut held: b keeps its last view of a meanwhile.
	changed := 0
	tick := time.NewTicker(100 * time.Millisecond)
	for {
		if v := viewOfA(gb); !slices.Equal(v, []string{"a-1@a", "a-2@a"}) {
			if changed == 0 {
				b.Logf("b's view of a changed during the cut, %v after it: %v", time.Since(cutAt).Round(time.Millisecond), v)
			}
			changed = 1
		}
		if time.Since(cutAt) >= hold {
			break
		}
		<-tick.C
	}
	tick.Stop()
	cutFor := time.Since(cutAt)

	healAt := time.Now()
	r.Heal(b, "b")
	back := time.Now()
	linkBack := back.Sub(healAt)
	testutil.EventuallyWithin(b, waitTimeout, "b to list a's instances as they are", func() bool {
		return slices.Equal(viewOfA(gb), []string{"a-2@a", "a-3@a"})
	})
	listRight := time.Since(back)
	testutil.EventuallyWithin(b, waitTimeout, "b to see a linked again", func() bool { return gb.stale("a") == 0 })
	unstale := time.Since(back)
	for _, n := range names {
		waitIDs(b, gws[n], listed(n, ids)...)
	}
	var failed, sent int64
	for _, n := range names {
		l := loads[n]
		l.halt()
		failed += l.failed.Load()
		sent += l.sent.Load()
		if f := l.failed.Load(); f != 0 {
			b.Logf("gateway %s: %d of %d requests failed; the first: %v", n, f, l.sent.Load(), l.firstErr.Load())
		}
	}

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	b.ReportMetric(float64(failed), "failed")
	b.ReportMetric(float64(sent), "requests")
	b.ReportMetric(ms(staleA), "stale-a-ms")
	b.ReportMetric(ms(staleB), "stale-b-ms")
	b.ReportMetric(float64(changed), "view-changed")
	b.ReportMetric(cutFor.Seconds(), "cut-s")
	b.ReportMetric(ms(linkBack), "link-back-ms")
	b.ReportMetric(ms(listRight), "list-right-ms")
	b.ReportMetric(ms(listRight+linkBack), "list-right-total-ms")
	b.ReportMetric(ms(unstale), "unstale-ms")
	if regions == 3 {
		b.ReportMetric(ms(otherRight), "c-right-during-cut-ms")
	}
}

// newHTTPClient is a client for the gateways' proxy and admin listeners;
// its idle connections are closed at the end of the benchmark.
func newHTTPClient(b *testing.B) *http.Client {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 10 * time.Second}
	b.Cleanup(c.CloseIdleConnections)
	return c
}

// gateway is a gateway process.
type gateway struct {
	proc         *testutil.Proc
	hc           *http.Client
	proxy, admin string
}

// startGateway starts a gateway on region's server, in that region,
// copying the records of remotes (its reaper leads: the only gateway of
// its region), following every service, and waits until it started.
func startGateway(b *testing.B, hc *http.Client, r *natsproc.Regions, region string, remotes ...string) *gateway {
	g := &gateway{hc: hc, proxy: testutil.FreeAddr(b), admin: testutil.FreeAddr(b)}
	args := []string{"-listen", g.proxy, "-admin", g.admin, "-nats", r.URL(region), "-follow", "all", "-region", region}
	for _, rem := range remotes {
		args = append(args, "-remote-region", rem)
	}
	g.proc = testutil.StartCmd(b, exec.Command(bins.gateway, args...))
	g.proc.WaitFor(b, "gateway started", waitTimeout)
	return g
}

// ids returns the IDs of the service's instances in the gateway's list,
// sorted; nil when it cannot be read.
func (g *gateway) ids() []string {
	var st struct {
		Servers []struct {
			ID string `json:"id"`
		} `json:"servers"`
	}
	if !g.get("/-/lb/service?name="+service, &st) {
		return nil
	}
	ids := make([]string, 0, len(st.Servers))
	for _, s := range st.Servers {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return ids
}

// stale returns 1 when the gateway's /-/lb marks region stale, 0 when it
// shows it not stale, -1 when it does not show it.
func (g *gateway) stale(region string) int {
	var st struct {
		Regions []struct {
			Region string `json:"region"`
			Stale  bool   `json:"stale"`
		} `json:"regions"`
	}
	if !g.get("/-/lb", &st) {
		return -1
	}
	for _, v := range st.Regions {
		if v.Region == region {
			if v.Stale {
				return 1
			}
			return 0
		}
	}
	return -1
}

// get reads the admin listener's JSON at path into v.
func (g *gateway) get(path string, v any) bool {
	code, body, err := testutil.Fetch(g.hc, "http://"+g.admin+path)
	return err == nil && code == http.StatusOK && json.Unmarshal([]byte(body), v) == nil
}

// waitIDs waits until the gateway lists exactly ids (sorted).
func waitIDs(b *testing.B, g *gateway, ids ...string) {
	b.Helper()
	want := slices.Sorted(slices.Values(ids))
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(waitTimeout)
	for {
		got := g.ids()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("gateway %s lists %v after %v, want %v", g.proxy, got, waitTimeout, want)
		}
		<-poll.C
	}
}

// backend is an instance's HTTP server: it answers with its ID and counts
// what it served.
type backend struct {
	id   string
	srv  *httptest.Server
	hits atomic.Int64
	// first is when the first request after arm was served (UnixNano), 0
	// before one was or while disarmed.
	first atomic.Int64
	armed atomic.Bool
	once  sync.Once
}

func newBackend(b *testing.B, id string) *backend {
	bk := &backend{id: id}
	bk.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		bk.hits.Add(1)
		if bk.armed.Load() {
			bk.first.CompareAndSwap(0, time.Now().UnixNano())
		}
		io.WriteString(w, id)
	}))
	b.Cleanup(bk.close)
	return bk
}

func (bk *backend) addr() string { return bk.srv.Listener.Addr().String() }
func (bk *backend) close()       { bk.once.Do(bk.srv.Close) }

func (bk *backend) arm() {
	bk.first.Store(0)
	bk.armed.Store(true)
}

func (bk *backend) disarm() {
	bk.armed.Store(false)
	bk.first.Store(0)
}

// announce starts an announce process that holds bk's instance of the
// service in region's registry (announce -region).
func announce(b *testing.B, r *natsproc.Regions, region string, bk *backend) *testutil.Proc {
	return testutil.StartCmd(b, exec.Command(bins.announce, "-nats", r.URL(region), "-service", service,
		"-addr", bk.addr(), "-id", bk.id, "-region", region, "-drain", "0s"))
}

// load is clients sending requests through a gateway, one after another
// each, until halt.
type load struct {
	stop     chan struct{}
	done     sync.WaitGroup
	once     sync.Once
	sent     atomic.Int64
	failed   atomic.Int64
	firstErr atomic.Value // string: the first failure
}

func startLoad(b *testing.B, hc *http.Client, g *gateway, clients int) *load {
	l := &load{stop: make(chan struct{})}
	url := "http://" + g.proxy + "/" + service + "/"
	for range clients {
		l.done.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				code, body, err := testutil.Fetch(hc, url)
				l.sent.Add(1)
				if err != nil || code != http.StatusOK {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %q %v", code, body, err))
				}
			}
		})
	}
	b.Cleanup(l.halt)
	return l
}

// halt stops the clients and waits for them; safe to call twice.
func (l *load) halt() {
	l.once.Do(func() {
		close(l.stop)
		l.done.Wait()
	})
}
