package scale_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// BenchmarkFleetConvergence: G gateway processes (PUSHLB_SCALE's third
// figure; 100 for docs/perf.md), each following 10 services (svc-0, which
// they all follow, and 9 others: -follow requested with
// subscriber.services), against nats-server processes (one, then a
// cluster of three with the registry replicated three times) holding the
// fleet's records. Every gateway reports what it applied (-report-id, at
// most every second, the default); the benchmark reads the reports and
// takes each gateway's own time of applying a list (Applied.At) whose
// digest is the one expected, so that no polling delay enters the
// figures. Measured, in one
// run:
//   - hop-*: the raw NATS hop while the gateways idle, one publisher to G subscribers (one
//     connection each), from publish to receipt;
//   - offline-*: a graceful offline of an svc-0 instance (offline event,
//     deregistration), from the call to each gateway's list without it;
//   - crash-*: an svc-0 instance killed (its backend closed, its NATS
//     connection dropped, nothing announced), from the kill to each
//     gateway's list without it (the disconnect advisory, then a probe);
//   - wave-*: 1 % of the fleet's instances replaced (offline events and
//     purges, then new records and online events, in two batches), each
//     gateway's convergence from the last write acknowledged to the last
//     of its lists that the wave changed (0: before the ack), and from
//     the wave's first write (wave-total; the writes take wave-write-ms);
//   - follow-*: one request to each gateway, at once, for a service none
//     follows yet (one real backend), from the request to its answer;
//     the consumers it costs the servers, and the time until the idle
//     gateways unfollowed it (idleUnfollow 1s: consumers back);
//   - the servers' consumers per gateway, RSS and CPU; the CPU the idle
//     gateways take (gw-idle-cpu-%, of one core), which bounds how fast
//     100 processes on a small machine can all apply a change.
//
// p50, p99 and max are over the gateways (over every receipt for hop).
func BenchmarkFleetConvergence(b *testing.B) {
	sz := size(b)
	for _, nodes := range []int{1, 3} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			for b.Loop() {
				fleetConvergence(b, sz, nodes)
			}
		})
	}
}

// followedPerGateway is how many services each gateway follows.
const followedPerGateway = 10

func fleetConvergence(b *testing.B, sz scale.Size, nodes int) {
	ctx := b.Context()
	srv := startNATSProcs(b, nodes)
	nc := srv.connect(b)
	f, err := scale.NewFleet(ctx, nc, sz, fleetTTL, nodes)
	if err != nil {
		b.Fatal(err)
	}
	gen0 := f.Generation(0) // each call numbers incarnations anew
	recs, err := scale.Encode(gen0...)
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Put(ctx, recs); err != nil {
		b.Fatal(err)
	}
	// svc-0: real instances (a backend and a publisher with a connection
	// of its own each), in place of the fleet's records.
	if err := f.Deregister(ctx, nc, gen0[:sz.Instances]...); err != nil {
		b.Fatal(err)
	}
	real := make([]*realInstance, min(sz.Instances, 8))
	for i := range real {
		real[i] = startRealInstance(b, srv, scale.ServiceName(0), fmt.Sprintf("real-%d", i))
	}
	truth := newFleetTruth(f, sz, gen0[sz.Instances:], real)

	before := srv.consumers(b)
	view := watchReports(b, nc)
	gws := startFleetGateways(b, srv, sz)
	view.waitReached(b, gws, truth.digest, time.Time{}, nil)
	perGateway := float64(srv.consumers(b)-before) / float64(len(gws))
	cpu0 := srv.cpu(b)
	measured := time.Now()
	// The raw hop, timed while the gateways idle; their CPU meanwhile is
	// what idle gateways cost the machine (their timers, a report a second
	// at most): the share of its cores left for a change.
	idle0, idleAt := gatewaysCPU(b, gws), time.Now()
	hop := rawHop(b, srv, sz.Gateways)
	idleCPU := 100 * float64(gatewaysCPU(b, gws)-idle0) / float64(time.Since(idleAt))

	// A graceful offline of svc-0's first real instance.
	cpuOff := gatewaysCPU(b, gws)
	t0 := time.Now()
	if err := real[0].pub.Withdraw(ctx, "benchmark"); err != nil {
		b.Fatal(err)
	}
	truth.remove(real[0])
	offline := view.waitReached(b, gws, truth.digest, t0, []string{scale.ServiceName(0)})
	offCPUTotal, offTook := gatewaysCPU(b, gws)-cpuOff, time.Since(t0)

	// A crash of the second.
	t0 = time.Now()
	real[1].crash()
	truth.remove(real[1])
	crash := view.waitReached(b, gws, truth.digest, t0, []string{scale.ServiceName(0)})

	// A wave: 1 % of the fleet's instances (at least one) replaced.
	old, next := truth.wave(sz.Total()/100, 2)
	t0 = time.Now()
	if err := f.Deregister(ctx, nc, old...); err != nil {
		b.Fatal(err)
	}
	if err := f.Register(ctx, nc, next...); err != nil {
		b.Fatal(err)
	}
	acked := time.Now()
	touched := map[string]bool{}
	for _, in := range next {
		touched[in.Service] = true
	}
	wave := view.waitReached(b, gws, truth.digest, t0, slices.Sorted(mapsKeys(touched)))
	waveAfterAck := make([]time.Duration, len(wave))
	for i, d := range wave {
		waveAfterAck[i] = max(0, d-acked.Sub(t0))
	}

	// On-demand follows: every gateway asked at once for a service none
	// follows.
	req := startRealInstance(b, srv, "svc-requested", "requested-0")
	follows := make([]time.Duration, len(gws))
	var wg sync.WaitGroup
	for i, g := range gws {
		wg.Go(func() {
			start := time.Now()
			for {
				resp, err := http.Get("http://" + g.listen + "/svc-requested/x")
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
				if time.Since(start) > time.Minute {
					b.Errorf("%s: svc-requested not routed within a minute (last: %v)", g.id, err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			follows[i] = time.Since(start)
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	followed := srv.consumers(b)
	unfollowStart := time.Now()
	testutil.EventuallyWithin(b, 2*time.Minute, "the idle gateways unfollowed svc-requested", func() bool {
		return srv.consumers(b) <= followed-len(gws)
	})
	unfollowed := time.Since(unfollowStart)
	// The CPU one gateway spends on the offline (its event, then its
	// record's deletion), beyond what it spends idle meanwhile.
	offCPU := max(0, float64(offCPUTotal)-idleCPU/100*float64(offTook)) / float64(len(gws)) / 1e6
	cpu1 := srv.cpu(b)
	req.pub.Close()

	reportQuantiles(b, "hop", hop)
	reportQuantiles(b, "offline", offline)
	reportQuantiles(b, "crash", crash)
	reportQuantiles(b, "wave", waveAfterAck)
	reportQuantiles(b, "wave-total", wave)
	b.ReportMetric(float64(acked.Sub(t0))/1e6, "wave-write-ms")
	b.ReportMetric(idleCPU, "gw-idle-cpu-%")
	b.ReportMetric(offCPU, "gw-cpu-ms/offline")
	reportQuantiles(b, "follow", follows)
	b.ReportMetric(float64(len(old)), "wave-instances")
	b.ReportMetric(perGateway, "consumers/gw")
	b.ReportMetric(float64(followed-(before+int(perGateway*float64(len(gws))))), "follow-consumers")
	b.ReportMetric(unfollowed.Seconds(), "unfollow-s")
	b.ReportMetric(float64(srv.rss(b))/1e6, "nats-rss-MB")
	b.ReportMetric(100*float64(cpu1-cpu0)/float64(time.Since(measured)), "nats-cpu-%")
	b.ReportMetric(float64(len(gws)), "gateways")
	b.ReportMetric(float64(sz.Total()), "instances")
}

// reportQuantiles reports p50, p99 and max of ds in milliseconds.
func reportQuantiles(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := min(len(s)-1, int(float64(len(s))*p))
		return float64(s[i].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), name+"-p50-ms")
	b.ReportMetric(q(0.99), name+"-p99-ms")
	b.ReportMetric(float64(s[len(s)-1].Microseconds())/1000, name+"-max-ms")
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// natsProcs is a nats-server process, or a cluster of them, with
// pushlb's accounts (natsproc).
type natsProcs struct{ *natsproc.Cluster }

// natsBins is the nats-server binary, built from the module on first use.
var natsBins = testutil.NewLazyBinaries(natsproc.Module)

// natsServer returns the nats-server binary, built from the module on
// first use.
func natsServer(tb testing.TB) string { return natsBins.Paths(tb)[0] }

// startNATSProcs starts n nats-server processes (a cluster when n > 1)
// and waits until JetStream answers.
func startNATSProcs(tb testing.TB, n int) *natsProcs {
	return &natsProcs{natsproc.Start(tb, natsServer(tb), n)}
}

func (s *natsProcs) url() string { return s.URL() }

// connect returns a connection to the servers, closed at cleanup.
func (s *natsProcs) connect(tb testing.TB) *nats.Conn { return s.Connect(tb) }

// consumers counts the JetStream consumers of the application account.
func (s *natsProcs) consumers(tb testing.TB) int {
	nc := s.connect(tb)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(tb.Context(), 10*time.Second)
	defer cancel()
	info, err := js.AccountInfo(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return info.Consumers
}

// cpu returns the servers' CPU time so far.
func (s *natsProcs) cpu(tb testing.TB) time.Duration {
	var sum time.Duration
	for _, p := range s.Procs {
		c, _ := procStat(tb, p.Pid())
		sum += c
	}
	return sum
}

// gatewaysCPU returns the CPU time the gateways used, summed.
func gatewaysCPU(tb testing.TB, gws []*fleetGateway) time.Duration {
	var sum time.Duration
	for _, g := range gws {
		c, _ := procStat(tb, g.proc.Pid())
		sum += c
	}
	return sum
}

// rss returns the servers' resident memory, summed.
func (s *natsProcs) rss(tb testing.TB) int64 {
	var sum int64
	for _, p := range s.Procs {
		_, r := procStat(tb, p.Pid())
		sum += r
	}
	return sum
}

// realInstance is an instance with a backend and a publisher on a
// connection of its own.
type realInstance struct {
	in      serverlist.Instance
	backend *httptest.Server
	nc      *nats.Conn
	pub     *publisher.Publisher
}

func startRealInstance(tb testing.TB, s *natsProcs, service, id string) *realInstance {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(id)) }))
	tb.Cleanup(backend.Close)
	nc := s.connect(tb)
	host, port, _ := net.SplitHostPort(backend.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	in := serverlist.Instance{Service: service, InstanceID: id, Host: host, Port: p}
	pub := testpub.New(tb, nc, publisher.Config{})
	if err := pub.Announce(tb.Context(), in); err != nil {
		tb.Fatal(err)
	}
	return &realInstance{in: pub.Instance(), backend: backend, nc: nc, pub: pub}
}

// crash closes the backend and drops the connection, announcing nothing.
func (r *realInstance) crash() {
	r.backend.Close()
	r.nc.Close()
}

// fleetTruth is what every gateway's lists should be: the instances of
// each service, and their digest.
type fleetTruth struct {
	f         *scale.Fleet
	sz        scale.Size
	instances map[string]map[string]int64 // service -> ID -> incarnation
	fake      []serverlist.Instance       // the fleet's records, of services 1..
	next      int
}

func newFleetTruth(f *scale.Fleet, sz scale.Size, fake []serverlist.Instance, real []*realInstance) *fleetTruth {
	t := &fleetTruth{f: f, sz: sz, instances: map[string]map[string]int64{}, fake: slices.Clone(fake)}
	for _, in := range t.fake {
		t.add(in.Service, in.InstanceID, in.Incarnation)
	}
	for _, r := range real {
		t.add(r.in.Service, r.in.InstanceID, r.in.Incarnation)
	}
	return t
}

func (t *fleetTruth) add(service, id string, inc int64) {
	if t.instances[service] == nil {
		t.instances[service] = map[string]int64{}
	}
	t.instances[service][id] = inc
}

func (t *fleetTruth) remove(r *realInstance) { delete(t.instances[r.in.Service], r.in.InstanceID) }

// wave picks n of the fleet's records of services 1.., spread over the
// services, and their successors of generation gen, and updates the truth.
func (t *fleetTruth) wave(n, gen int) (old, next []serverlist.Instance) {
	n = max(1, min(n, len(t.fake)))
	stride := len(t.fake) / n
	for k := range n {
		i := k * stride
		o := t.fake[i]
		nw := t.f.Instance(1+i/t.sz.Instances, i%t.sz.Instances, gen)
		old, next = append(old, o), append(next, nw)
		delete(t.instances[o.Service], o.InstanceID)
		t.add(nw.Service, nw.InstanceID, nw.Incarnation)
		t.fake[i] = nw
	}
	return old, next
}

// digest is what a gateway's list of service should sum to.
func (t *fleetTruth) digest(service string) string {
	ids := t.instances[service]
	d := convergence.NewListDigest()
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range ids {
			if !yield(id) {
				return
			}
		}
	}) {
		d.Add(id, ids[id])
	}
	return d.Sum()
}

// fleetGateway is a gateway process and the services it follows.
type fleetGateway struct {
	id, listen string
	services   []string
	proc       *testutil.Proc
}

// startFleetGateways starts sz.Gateways gateways: gateway i follows svc-0
// and 9 other services, spread so that each is followed by as many.
func startFleetGateways(b *testing.B, s *natsProcs, sz scale.Size) []*fleetGateway {
	gws := make([]*fleetGateway, sz.Gateways)
	others := sz.Services - 1
	for i := range gws {
		g := &fleetGateway{id: fmt.Sprintf("gw-%d", i), listen: testutil.FreeAddr(b), services: []string{scale.ServiceName(0)}}
		for j := range min(followedPerGateway-1, others) {
			g.services = append(g.services, scale.ServiceName(1+(i*(followedPerGateway-1)+j)%others))
		}
		conf := fmt.Sprintf("follow: requested\nidleUnfollow: 1s\nreport: {interval: 1s}\nsubscriber: {services: [%s]}\n", strings.Join(g.services, ", "))
		path := filepath.Join(b.TempDir(), "gateway.yaml")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			b.Fatal(err)
		}
		g.proc = testutil.StartCmd(b, exec.Command(gateway(b), "-config", path, "-nats", s.url(), "-listen", g.listen,
			"-admin", testutil.FreeAddr(b), "-report-id", g.id, "-lease", "10m", "-log-level", "warn"))
		gws[i] = g
	}
	return gws
}

// reportView keeps the newest report of each gateway.
type reportView struct {
	mu      sync.Mutex
	reports map[string]convergence.Report
	changed chan struct{}
}

func watchReports(tb testing.TB, nc *nats.Conn) *reportView {
	v := &reportView{reports: map[string]convergence.Report{}, changed: make(chan struct{}, 1)}
	sub, err := nc.Subscribe(convergence.WildcardSubject(events.DefaultPrefix), func(m *nats.Msg) {
		r, err := convergence.Decode(events.DefaultPrefix, m.Subject, m.Data)
		if err != nil {
			return
		}
		v.mu.Lock()
		if cur, ok := v.reports[r.Gateway]; !ok || r.Seq > cur.Seq {
			v.reports[r.Gateway] = r
		}
		v.mu.Unlock()
		select {
		case v.changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { sub.Unsubscribe() })
	return v
}

// reached returns, per gateway, how long after t0 it applied the lists
// digest expects of every service it follows among services (all when
// nil), or nil and what is missing while one has not.
func (v *reportView) reached(gws []*fleetGateway, digest func(string) string, t0 time.Time, services []string) ([]time.Duration, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]time.Duration, len(gws))
	for i, g := range gws {
		r, ok := v.reports[g.id]
		if !ok {
			return nil, g.id + ": no report"
		}
		var last time.Time
		for _, s := range g.services {
			if services != nil && !slices.Contains(services, s) {
				continue
			}
			a, ok := r.Services[s]
			if !ok || a.Digest != digest(s) {
				return nil, fmt.Sprintf("%s: %s applied %+v, want digest %s", g.id, s, a, digest(s))
			}
			last = maxTime(last, a.At)
		}
		if !t0.IsZero() {
			out[i] = last.Sub(t0)
		}
	}
	return out, ""
}

// waitReached waits until every gateway applied the expected lists of
// services (all when nil) and returns, per gateway following one of them,
// how long after t0 it did.
func (v *reportView) waitReached(b *testing.B, gws []*fleetGateway, digest func(string) string, t0 time.Time, services []string) []time.Duration {
	var concerned []*fleetGateway
	for _, g := range gws {
		if services == nil || slices.ContainsFunc(g.services, func(s string) bool { return slices.Contains(services, s) }) {
			concerned = append(concerned, g)
		}
	}
	timeout := time.After(2 * time.Minute)
	for {
		out, missing := v.reached(concerned, digest, t0, services)
		if out != nil {
			return out
		}
		select {
		case <-v.changed:
		case <-timeout:
			b.Fatalf("not every gateway applied the lists expected within 2 minutes: %s", missing)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// rawHop measures NATS alone: one publisher, n subscribers on connections
// of their own; 100 messages, each carrying its send time. In a cluster a
// subscription reaches the other nodes a moment after it is made: warm-up
// messages go out until every subscriber has one.
func rawHop(b *testing.B, s *natsProcs, n int) []time.Duration {
	const msgs = 100
	var mu sync.Mutex
	out := make([]time.Duration, 0, n*msgs)
	warm := make(map[int]bool, n)
	var got sync.WaitGroup
	got.Add(n * msgs)
	for k := range n {
		nc := s.connect(b)
		if _, err := nc.Subscribe("bench.hop.*", func(m *nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			if m.Subject == "bench.hop.warm" {
				warm[k] = true
				return
			}
			sent, _ := strconv.ParseInt(string(m.Data), 10, 64)
			out = append(out, time.Since(time.Unix(0, sent)))
			got.Done()
		}); err != nil {
			b.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	pub := s.connect(b)
	testutil.EventuallyWithin(b, time.Minute, "every hop subscriber warmed up", func() bool {
		if err := pub.Publish("bench.hop.warm", nil); err != nil {
			b.Fatal(err)
		}
		pub.Flush()
		mu.Lock()
		defer mu.Unlock()
		return len(warm) == n
	})
	for range msgs {
		if err := pub.Publish("bench.hop.msg", []byte(strconv.FormatInt(time.Now().UnixNano(), 10))); err != nil {
			b.Fatal(err)
		}
		if err := pub.Flush(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // paced: one message's hop, not a burst's queue
	}
	done := make(chan struct{})
	go func() { got.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatal("the hop's messages did not all arrive")
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(out)
}
