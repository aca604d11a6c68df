package scale_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// small is what CI runs (every benchmark once, the whole package in well
// under 30 s); PUSHLB_SCALE=1000x100x20 gives the figures of docs/perf.md.
var small = scale.Size{Services: 20, Instances: 20, Gateways: 3}

const (
	// leasePeriod is the fleet's refresh interval: every instance re-puts
	// its record once per period.
	leasePeriod = 10 * time.Second
	// maxInFlight bounds the heartbeat puts awaiting their acknowledgement.
	maxInFlight = 4096
)

// bins is the gateway binary, built on first use.
var bins = testutil.NewLazyBinaries("../../../cmd/gateway")

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Remove()
	natsBins.Remove()
	if code == 0 {
		if err := goleak.Find(natstest.IgnoreServerGoroutines()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// gateway returns the gateway binary, built on first use, or the one
// PUSHLB_GATEWAY_BIN names (to compare two builds on the same load).
func gateway(tb testing.TB) string {
	if bin := os.Getenv("PUSHLB_GATEWAY_BIN"); bin != "" {
		return bin
	}
	return bins.Paths(tb)[0]
}

func size(tb testing.TB) scale.Size {
	s, err := scale.SizeFromEnv(small)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// fleetTTL is the bucket's lease in the benchmarks: long enough that no
// lease ends while a gateway starts against a large fleet (what a renewal
// costs does not depend on it).
const fleetTTL = 10 * time.Minute

// plainLeases reports whether PUSHLB_LEASES=plain asks for a fleet that
// writes plain leases (no expiry signal) into a bucket made without
// message schedules, as pushlb did before issue 22: the "before" figures.
func plainLeases() bool { return os.Getenv("PUSHLB_LEASES") == "plain" }

// full reports whether the run asked for a fleet size of its own: then
// measurement windows are long enough for stable figures.
func full() bool { return os.Getenv("PUSHLB_SCALE") != "" }

// window returns long when the run asked for a size of its own, else short.
func window(long, short time.Duration) time.Duration {
	if full() {
		return long
	}
	return short
}

// bus is the NATS deployment a benchmark runs on: one server or a cluster.
type bus struct {
	url      string
	replicas int
	connect  func(tb testing.TB) *nats.Conn
}

func deployments() map[string]func(tb testing.TB) bus {
	return map[string]func(tb testing.TB) bus{
		"single": func(tb testing.TB) bus {
			s := natstest.Start(tb)
			return bus{url: s.URL(), replicas: 1, connect: func(tb testing.TB) *nats.Conn { return s.Connect(tb) }}
		},
		"cluster3": func(tb testing.TB) bus {
			c := natstest.StartCluster(tb, 3)
			return bus{url: c.URL(), replicas: 3, connect: func(tb testing.TB) *nats.Conn { return c.Connect(tb) }}
		},
	}
}

func eachDeployment(b *testing.B, f func(b *testing.B, nb bus)) {
	names := []string{"single", "cluster3"}
	deps := deployments()
	for _, name := range names {
		b.Run(name, func(b *testing.B) { f(b, deps[name](b)) })
	}
}

// loadFleet writes generation 0 of the fleet into the registry and returns
// its records (to refresh) and the time the load took.
func loadFleet(tb testing.TB, nb bus, sz scale.Size) (*scale.Fleet, []scale.Record, time.Duration) {
	ctx, cancel := context.WithTimeout(tb.Context(), 5*time.Minute)
	defer cancel()
	if plainLeases() {
		if err := scale.CreatePlainBucket(ctx, nb.connect(tb), fleetTTL, nb.replicas); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			tb.Fatal(err)
		}
	}
	f, err := scale.NewFleet(ctx, nb.connect(tb), sz, fleetTTL, nb.replicas)
	if err != nil {
		tb.Fatal(err)
	}
	recs, err := scale.Encode(f.Generation(0)...)
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	if err := f.Put(ctx, recs); err != nil {
		tb.Fatal(err)
	}
	return f, recs, time.Since(start)
}

// fleetHeartbeats refreshes recs every leasePeriod on a connection of its
// own, as the fleet's announcers do, until the returned stop is called;
// stop returns what was sent and fails tb if the generator broke.
func fleetHeartbeats(tb testing.TB, nb bus, f *scale.Fleet, recs []scale.Record) (h *scale.Heartbeats, stop func() scale.HeartbeatStats) {
	h, err := scale.NewHeartbeats(nb.connect(tb), f, recs, leasePeriod, maxInFlight)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(tb.Context())
	var st scale.HeartbeatStats
	done := make(chan struct{})
	go func() {
		defer close(done)
		st, err = h.Run(ctx)
	}()
	var once sync.Once
	return h, func() scale.HeartbeatStats {
		once.Do(func() {
			cancel()
			<-done
			if err != nil {
				tb.Fatalf("heartbeats: %v", err)
			}
		})
		return st
	}
}

// reportHeartbeats reports what the fleet's heartbeats achieved, and says
// so in the log when the generator could not keep up with its schedule:
// the figures were then taken under a lighter load than asked.
func reportHeartbeats(b *testing.B, st scale.HeartbeatStats, sz scale.Size) {
	b.ReportMetric(st.Rate(), "puts/s")
	want := float64(sz.Total()) / leasePeriod.Seconds()
	if !st.KeptUp() {
		b.Logf("the heartbeats did not keep up: %.0f puts/s acknowledged of %.0f asked (due %d, sent %d, acked %d, failed %d, stalls %d, max behind %d)",
			st.Rate(), want, st.Due, st.Sent, st.Acked, st.Failed, st.Stalls, st.MaxBehind)
	}
}

// procStat returns the CPU time and the resident memory of process pid.
func procStat(tb testing.TB, pid int) (cpu time.Duration, rss int64) {
	cpu, rss, _ = procStatPeak(tb, pid)
	return cpu, rss
}

// procStatPeak is procStat with the peak resident memory so far (VmHWM).
func procStatPeak(tb testing.TB, pid int) (cpu time.Duration, rss, peak int64) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command name, which ends with ')'.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	cpu = time.Duration(utime+stime) * time.Second / 100 // USER_HZ
	status, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	defer status.Close()
	kB := func(v string) int64 {
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return n * 1024
	}
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			rss = kB(rest)
		}
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			peak = kB(rest)
		}
	}
	return cpu, rss, peak
}

var (
	serversLine   = regexp.MustCompile(`(?m)^pushlb_servers\{service="[^"]+"\} (\d+)$`)
	refreshesLine = regexp.MustCompile(`(?m)^pushlb_registry_refreshes_total (\S+)$`)
	leaderLine    = regexp.MustCompile(`(?m)^pushlb_reaper_leader 1$`)
	heapLine      = regexp.MustCompile(`(?m)^go_memstats_heap_inuse_bytes (\S+)$`)
	markedLine    = regexp.MustCompile(`(?m)^go_gc_heap_live_bytes (\S+)$`)
	gcsLine       = regexp.MustCompile(`(?m)^go_gc_duration_seconds_count (\S+)$`)
	allocLine     = regexp.MustCompile(`(?m)^go_memstats_alloc_bytes_total (\S+)$`)
	memLimitLine  = regexp.MustCompile(`(?m)^go_gc_gomemlimit_bytes (\S+)$`)
)

// gatewayMetrics is what the benchmarks read from a gateway's /metrics.
type gatewayMetrics struct {
	routed       int     // the sum of pushlb_servers over its services
	refreshes    float64 // record refreshes its mirror saw
	reaperLeader bool    // it leads the registry's reapers
	heap         float64 // Go heap in use, bytes
	marked       float64 // the heap the last GC marked, bytes
	gcs          float64 // GC cycles completed
	allocated    float64 // heap bytes allocated since the start
	memLimit     float64 // the runtime's soft memory limit, bytes (math.MaxInt64: none)
}

func scrape(tb testing.TB, admin string) gatewayMetrics {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	var m gatewayMetrics
	for _, l := range serversLine.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.Atoi(l[1])
		m.routed += v
	}
	if l := refreshesLine.FindStringSubmatch(string(body)); l != nil {
		m.refreshes, _ = strconv.ParseFloat(l[1], 64)
	}
	m.reaperLeader = leaderLine.MatchString(string(body))
	for _, v := range []struct {
		re  *regexp.Regexp
		dst *float64
	}{{heapLine, &m.heap}, {markedLine, &m.marked}, {gcsLine, &m.gcs}, {allocLine, &m.allocated}, {memLimitLine, &m.memLimit}} {
		if l := v.re.FindStringSubmatch(string(body)); l != nil {
			*v.dst, _ = strconv.ParseFloat(l[1], 64)
		}
	}
	return m
}

// startGateway runs the gateway binary on nb and waits until /readyz says
// ready: the client's Start returned, which it does once every registered
// instance is in a balancer. The binary is built before, not timed.
func startGateway(b *testing.B, nb bus, args ...string) (*testutil.Proc, string, time.Duration) {
	return startGatewayOn(b, nb, testutil.FreeAddr(b), args...)
}

// startGatewayOn is startGateway with the proxy listening on listen.
func startGatewayOn(b *testing.B, nb bus, listen string, args ...string) (*testutil.Proc, string, time.Duration) {
	admin, bin := testutil.FreeAddr(b), gateway(b)
	start := time.Now()
	cmd := exec.Command(bin, append([]string{"-nats", nb.url, "-listen", listen, "-admin", admin,
		"-lease", "10m", "-log-level", "warn", "-follow", "all"}, args...)...)
	if limit := os.Getenv("PUSHLB_GATEWAY_GOMEMLIMIT"); limit != "" {
		// The gateway's alone: the benchmark's process, with its
		// nats-server, keeps its own.
		cmd.Env = append(os.Environ(), "GOMEMLIMIT="+limit)
	}
	p := testutil.StartCmd(b, cmd)
	testutil.EventuallyWithin(b, 5*time.Minute, "the gateway to be ready", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p, admin, time.Since(start)
}

// BenchmarkColdStart: a gateway process starts against a registry holding
// the whole fleet; measured from its exec until Start returned (every
// balancer full, /readyz ready), with its resident memory and Go heap then
// (both depend on when the last GC ran), its peak resident memory (the
// high-water mark) so far, its peak resident memory over the settling
// window that follows (settled-MB: 10 s at a size of its own, the leading
// reaper's first sweep included, whose garbage lets the heap reach the
// GC's goal), and the heap the last GC of that window marked (marked-MB,
// go_gc_heap_live_bytes: the GC lets the heap grow to twice it). The
// figures are the last start's. The gateway runs as in production,
// without -pprof; with PUSHLB_PROFILE_DIR set it runs with -pprof (which
// keeps the runtime's heap profiling on, some 2 MB more) and the benchmark
// also saves its heap profile after a GC and reports its heap in use then
// (live-MB, see liveHeap). After the window it reports what a scrape of
// /metrics allocates (scrape-alloc-MB, scrapeAllocation).
// PUSHLB_GATEWAY_GOMEMLIMIT=80MiB runs the
// gateways with GOMEMLIMIT=80MiB (a build with -memory-limit takes it as
// its own: auto), for docs/perf.md's figures with a memory limit.
func BenchmarkColdStart(b *testing.B) {
	sz := size(b)
	settle := window(10*time.Second, 200*time.Millisecond)
	eachDeployment(b, func(b *testing.B, nb bus) {
		_, _, load := loadFleet(b, nb, sz)
		gateway(b)
		var total time.Duration
		var rss, peak, settled int64
		var heap, marked, live, scrapeAlloc float64
		profiling := os.Getenv("PUSHLB_PROFILE_DIR") != ""
		var args []string
		if profiling {
			args = append(args, "-pprof")
		}
		for b.Loop() {
			p, admin, took := startGateway(b, nb, args...)
			total += took
			m := scrape(b, admin)
			if m.routed != sz.Total() {
				b.Fatalf("gateway routes %d instances, want %d", m.routed, sz.Total())
			}
			_, rss, peak = procStatPeak(b, p.Pid())
			heap = m.heap
			settled = settledPeak(b, p.Pid(), settle)
			marked = scrape(b, admin).marked
			scrapeAlloc = scrapeAllocation(b, admin)
			if profiling {
				live = liveHeap(b, admin, b.Name())
			}
			p.Stop(b, 30*time.Second)
		}
		b.ReportMetric(float64(load.Milliseconds()), "load-ms")
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "start-ms")
		b.ReportMetric(float64(rss)/1e6, "rss-MB")
		b.ReportMetric(float64(peak)/1e6, "peak-MB")
		b.ReportMetric(float64(settled)/1e6, "settled-MB")
		b.ReportMetric(heap/1e6, "heap-MB")
		b.ReportMetric(marked/1e6, "marked-MB")
		b.ReportMetric(scrapeAlloc/1e6, "scrape-alloc-MB")
		if profiling {
			b.ReportMetric(live/1e6, "live-MB")
		}
		b.ReportMetric(float64(sz.Total()), "instances")
	})
}

// scrapeAllocation returns the heap a scrape of the gateway's /metrics
// allocates (gzip-compressed, as Prometheus asks), the mean over 20
// scrapes, from go_memstats_alloc_bytes_total.
func scrapeAllocation(tb testing.TB, admin string) float64 {
	const scrapes = 20
	before := scrape(tb, admin).allocated
	for range scrapes - 1 {
		scrape(tb, admin)
	}
	return (scrape(tb, admin).allocated - before) / scrapes
}

// settledPeak returns the peak resident memory (VmHWM) of process pid at
// the end of a window of length win: the window is the measurement (what
// the gateway does in its first seconds after ready), not a wait for an
// event.
func settledPeak(tb testing.TB, pid int, win time.Duration) int64 {
	t := time.NewTimer(win)
	defer t.Stop()
	<-t.C
	_, _, peak := procStatPeak(tb, pid)
	return peak
}

// BenchmarkHeartbeatCPU: the fleet renews its leases every 10 s in
// announce's form (Registry.RefreshLease's message, a compare-and-set on
// the lease's last revision; its instance count / 10 renewals per second),
// with the records written once as Registry.Claim does. Measured: the whole
// gateway process (the real binary, user+sys from /proc/<pid>/stat) over
// the window (30 s at a size of its own), once every lease was renewed
// (one lease period after the renewals start), as a share of one core,
// beside its CPU over an idle window before; the CPU per renewal beyond
// idle; its resident memory at the start of the window and its peak over
// each half of it. PUSHLB_LEASES=plain gives the fleet plain leases (the
// form before issue 22); PUSHLB_GATEWAY_BIN runs another build.
func BenchmarkHeartbeatCPU(b *testing.B) {
	sz := size(b)
	win := window(30*time.Second, time.Second)
	// Settled: every lease renewed once by compare-and-set, and the
	// garbage of the first round collected, before the window opens.
	warm := window(leasePeriod+2*time.Second, 200*time.Millisecond)
	eachDeployment(b, func(b *testing.B, nb bus) {
		f, recs, _ := loadFleet(b, nb, sz)
		gateway(b)
		// "gateway": a gateway that does not lead the reapers (-reaper=false
		// here; a follower costs the same), which no renewal reaches.
		// "reaper": the gateway that leads them, which receives every one.
		for _, role := range []struct {
			name   string
			args   []string
			leader bool
		}{{"gateway", []string{"-reaper=false"}, false}, {"reaper", nil, true}} {
			b.Run(role.name, func(b *testing.B) {
				p, admin, _ := startGateway(b, nb, role.args...)
				defer p.Stop(b, 30*time.Second)
				heartbeatCPU(b, p, admin, nb, sz, f, recs, win, warm, role.leader)
			})
		}
	})
	// "embedded": as a new user runs it (docs/protocol.md's quick start), a
	// gateway with its embedded NATS server, which leads the reapers, and a
	// second gateway on that server: the leader's process stores every
	// renewal besides reaping.
	b.Run("embedded", func(b *testing.B) {
		natsAddr := testutil.FreeAddr(b)
		lead, leadAdmin, _ := startGateway(b, bus{}, "-embedded-nats", natsAddr, "-data-dir", b.TempDir())
		defer lead.Stop(b, 30*time.Second)
		url := "nats://" + natsAddr
		nb := bus{url: url, replicas: 1, connect: func(tb testing.TB) *nats.Conn {
			nc, err := nats.Connect(url)
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(nc.Close)
			return nc
		}}
		f, recs, _ := loadFleet(b, nb, sz)
		b.Run("reaper", func(b *testing.B) { heartbeatCPU(b, lead, leadAdmin, nb, sz, f, recs, win, warm, true) })
		b.Run("gateway", func(b *testing.B) {
			p, admin, _ := startGateway(b, nb, "-reaper=false")
			defer p.Stop(b, 30*time.Second)
			heartbeatCPU(b, p, admin, nb, sz, f, recs, win, warm, false)
		})
	})
}

// heartbeatCPU measures the gateway process p (admin address admin) under
// the fleet's renewals. Its sleeps are the measurement windows themselves (CPU
// time over wall time, resident memory sampled every second): they order
// no event and no absence is checked after one; what the gateway did is
// read from its /metrics and /proc.
func heartbeatCPU(b *testing.B, p *testutil.Proc, admin string, nb bus, sz scale.Size, f *scale.Fleet, recs []scale.Record, win, warm time.Duration, leader bool) {
	if leader {
		testutil.EventuallyWithin(b, time.Minute, "the gateway to lead the reapers", func() bool { return scrape(b, admin).reaperLeader })
	}

	// The gateway's own background (timers, GC, metrics), with no load,
	// once the start's aftermath (the registry's second delivery of each
	// service, the GC of the load's garbage) is over.
	time.Sleep(window(10*time.Second, 200*time.Millisecond))
	idle := win / 4
	idle0, _ := procStat(b, p.Pid())
	time.Sleep(idle)
	idle1, _ := procStat(b, p.Pid())
	idleShare := (idle1 - idle0).Seconds() / idle.Seconds()

	var cpuShare, perRenewal, seenRate float64
	var rss0, rssHalf1, rssHalf2 int64
	var hb scale.HeartbeatStats
	for b.Loop() {
		_, stop := fleetHeartbeats(b, nb, f, recs)
		time.Sleep(warm)
		// A scrape costs the gateway CPU: it stays out of the window.
		m0 := scrape(b, admin)
		cpu0, r0 := procStat(b, p.Pid())
		start := time.Now()
		// The resident memory every second: steady means the second half
		// of the window peaks no higher than the first (the heap grows
		// with the renewals' garbage until a GC, then drops).
		rssHalf1, rssHalf2 = r0, 0
		for tick := time.Second; tick <= win; tick += time.Second {
			time.Sleep(time.Until(start.Add(tick)))
			_, r := procStat(b, p.Pid())
			if tick <= win/2 {
				rssHalf1 = max(rssHalf1, r)
			} else {
				rssHalf2 = max(rssHalf2, r)
			}
		}
		time.Sleep(time.Until(start.Add(win)))
		cpu1, r1 := procStat(b, p.Pid())
		elapsed := time.Since(start)
		m1 := scrape(b, admin)
		hb = stop()
		used := (cpu1 - cpu0).Seconds()
		cpuShare = used / elapsed.Seconds()
		// Record refreshes its mirror saw: none, renewals write the leases.
		seenRate = (m1.refreshes - m0.refreshes) / elapsed.Seconds()
		if renewals := hb.Rate() * elapsed.Seconds(); renewals > 0 {
			perRenewal = max(used-idleShare*elapsed.Seconds(), 0) / renewals
		}
		rss0, rssHalf2 = r0, max(rssHalf2, r1)
	}
	if m := scrape(b, admin); m.routed != sz.Total() || m.reaperLeader != leader {
		b.Fatalf("after the heartbeats the gateway routes %d instances (want %d), leads the reapers: %v (want %v)", m.routed, sz.Total(), m.reaperLeader, leader)
	}
	b.ReportMetric(100*cpuShare, "cpu-%")
	b.ReportMetric(100*idleShare, "idle-cpu-%")
	b.ReportMetric(1e6*perRenewal, "µs/renewal")
	reportHeartbeats(b, hb, sz)
	b.ReportMetric(seenRate, "seen/s")
	b.ReportMetric(float64(rss0)/1e6, "rss0-MB")
	b.ReportMetric(float64(rssHalf1)/1e6, "rss-h1-MB")
	b.ReportMetric(float64(rssHalf2)/1e6, "rss-h2-MB")
}

// gateways starts n in-process clients, each on its own connection, with
// the fleet loaded; hook, if set, sees each client's events, and observe
// each client's list changes, with the client's index.
func gateways(b *testing.B, nb bus, n int, hook func(gw int, e events.Event), observe func(gw int, service string, cur []*balancer.Server)) []*pushlb.Client {
	out := make([]*pushlb.Client, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		var opts []pushlb.Option
		if hook != nil {
			opts = append(opts, pushlb.WithEventHook(func(e events.Event) { hook(i, e) }))
		}
		if observe != nil {
			opts = append(opts, pushlb.WithListObserver(func(lc pushlb.ListChange) { observe(i, lc.Service, lc.Servers) }))
		}
		c, err := pushlb.New(nb.connect(b), pushlb.Config{Follow: pushlb.FollowAll, ServiceGrace: time.Hour, AntiEntropy: time.Hour, Reaper: true}, opts...)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = c
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
			defer cancel()
			errs[i] = c.Start(ctx)
		})
		b.Cleanup(func() { c.Close() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// probeServices is the number of services the propagation probe rotates
// over: a service's coalescing window (10 ms) after the previous probe's
// removal is long over when the next probe comes to it.
const probeServices = 32

// BenchmarkPropagation: one instance registers, as an announcer does (a
// put, acknowledged, then its online event), while the fleet's heartbeats
// run; the time from the start of the registration until each gateway's
// balancer lists it, beside a raw NATS hop from the same publisher to as
// many subscribers on connections of their own, in the same run. Each
// iteration's probe goes to another service and is removed, on every
// gateway, before the next one: each measures an independent change, not
// the subscriber's coalescing window (10 ms) after the previous one.
//
// Reported: push (registration started → listed, every gateway of every
// iteration), all (→ listed by the last gateway), put (the put's round
// trip, part of push), hop (the online event published → received by a
// gateway's subscriber), raw (the raw hop), fallbacks per probe (lookups
// the mirror could not serve at once because it had not applied the put
// when the event's delivery ran: one registry read each), fallbacks-off
// the same during the probe's removal. A gateway lists the probe on
// whichever comes first, the put (through its mirror) or the event.
func BenchmarkPropagation(b *testing.B) {
	sz := size(b)
	eachDeployment(b, func(b *testing.B, nb bus) {
		f, recs, _ := loadFleet(b, nb, sz)

		type seen struct {
			gw int
			at time.Time
		}
		listed := make(chan seen, 4*sz.Gateways)
		arrived := make(chan seen, 4*sz.Gateways)
		var probe atomic.Pointer[string] // the current probe's ID
		// Each gateway reports the first list that holds a probe, once.
		reported := make([]atomic.Pointer[string], sz.Gateways)
		gws := gateways(b, nb, sz.Gateways, func(gw int, e events.Event) {
			if id := probe.Load(); id != nil && e.InstanceID == *id && e.Kind == events.Online {
				arrived <- seen{gw, time.Now()}
			}
		}, func(i int, _ string, cur []*balancer.Server) {
			id, was := probe.Load(), reported[i].Load()
			if id == nil || id == was || !slices.ContainsFunc(cur, func(s *balancer.Server) bool { return s.ID == *id }) {
				return
			}
			if reported[i].CompareAndSwap(was, id) {
				listed <- seen{i, time.Now()}
			}
		})
		nsvc := min(sz.Services, probeServices)
		raw := make(chan time.Time, sz.Gateways)
		for range sz.Gateways {
			sub, err := nb.connect(b).Subscribe("raw.hop", func(*nats.Msg) { raw <- time.Now() })
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Unsubscribe()
		}
		pub := nb.connect(b)
		if err := pub.Flush(); err != nil {
			b.Fatal(err)
		}
		_, stop := fleetHeartbeats(b, nb, f, recs)
		defer stop()
		time.Sleep(window(3*time.Second, 200*time.Millisecond)) // the heartbeats in full swing

		fallbacks := func() (n uint64) {
			for _, c := range gws {
				n += c.Stats().Lookups.Misses
			}
			return n
		}
		var misses, missesOff uint64
		var pushLat, allLat, hopLat, rawLat, putLat []time.Duration
		lastUse := make([]time.Time, nsvc)
		gen, iter := 1, 0
		for b.Loop() {
			s := iter % nsvc
			iter++
			// A service reused within its coalescing window would measure
			// the window, not the path.
			if wait := time.Until(lastUse[s].Add(50 * time.Millisecond)); wait > 0 {
				time.Sleep(wait)
			}
			in := f.Instance(s, 0, gen)
			gen++
			probe.Store(&in.InstanceID)
			rec, err := scale.Encode(in)
			if err != nil {
				b.Fatal(err)
			}
			misses0 := fallbacks()
			start := time.Now()
			if err := f.Put(b.Context(), rec); err != nil {
				b.Fatal(err)
			}
			published := time.Now()
			putLat = append(putLat, published.Sub(start))
			if err := scale.Announce(pub, events.Online, in); err != nil {
				b.Fatal(err)
			}
			var last time.Duration
			for range sz.Gateways {
				d := testutil.Receive(b, listed, time.Minute, "a gateway to list the probe").at.Sub(start)
				pushLat = append(pushLat, d)
				last = max(last, d)
			}
			allLat = append(allLat, last)
			misses += fallbacks() - misses0
			for range sz.Gateways {
				hopLat = append(hopLat, testutil.Receive(b, arrived, time.Minute, "the probe's event at a gateway").at.Sub(published))
			}
			start = time.Now()
			pub.Publish("raw.hop", nil)
			for range sz.Gateways {
				rawLat = append(rawLat, testutil.Receive(b, raw, time.Minute, "the raw hop").Sub(start))
			}
			probe.Store(nil)
			misses0 = fallbacks()
			if err := f.Deregister(b.Context(), pub, in); err != nil {
				b.Fatal(err)
			}
			testutil.EventuallyWithin(b, time.Minute, "every gateway to drop the probe", func() bool {
				return listsNone(gws, in.Service, in.InstanceID)
			})
			lastUse[s] = time.Now()
			missesOff += fallbacks() - misses0
		}
		reportHeartbeats(b, stop(), sz)
		report := func(d []time.Duration, name string) {
			b.ReportMetric(float64(testutil.Percentile(d, 0.5).Microseconds()), name+"-p50-µs")
			b.ReportMetric(float64(testutil.Percentile(d, 0.99).Microseconds()), name+"-p99-µs")
		}
		report(pushLat, "push")
		report(allLat, "all")
		report(hopLat, "hop")
		report(rawLat, "raw")
		b.ReportMetric(float64(testutil.Percentile(putLat, 0.5).Microseconds()), "put-p50-µs")
		b.ReportMetric(float64(misses)/float64(b.N), "fallbacks/op")
		b.ReportMetric(float64(missesOff)/float64(b.N), "fallbacks-off/op")
	})
}

// listsNone reports whether no gateway lists id in service.
func listsNone(gws []*pushlb.Client, service, id string) bool {
	for _, c := range gws {
		bal, err := c.Balancer(service)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(bal.Servers(), func(s *balancer.Server) bool { return s.ID == id }) {
			return false
		}
	}
	return true
}

// listConvergence tracks which services each gateway still lists otherwise
// than wanted, so that a poll re-checks only those.
type listConvergence struct {
	gws     []*pushlb.Client
	want    map[string]map[string]bool // service → the IDs it must list
	pending []map[string]bool          // per gateway, the services not yet right
}

func newConvergence(gws []*pushlb.Client, want map[string]map[string]bool) *listConvergence {
	c := &listConvergence{gws: gws, want: want}
	for range gws {
		p := make(map[string]bool, len(want))
		for svc := range want {
			p[svc] = true
		}
		c.pending = append(c.pending, p)
	}
	return c
}

// done re-checks the pending services and reports whether none is left.
func (c *listConvergence) done() bool {
	left := 0
	for i, gw := range c.gws {
		for svc := range c.pending[i] {
			if lists(gw, svc, c.want[svc]) {
				delete(c.pending[i], svc)
			}
		}
		left += len(c.pending[i])
	}
	return left == 0
}

// String describes what is left: the services each gateway still lists
// otherwise than wanted, the first of them in detail.
func (c *listConvergence) String() string {
	var b strings.Builder
	for i, p := range c.pending {
		if len(p) == 0 {
			continue
		}
		fmt.Fprintf(&b, "gateway %d: %d services not converged", i, len(p))
		for svc := range p {
			var got []string
			if bal, err := c.gws[i].Balancer(svc); err == nil {
				for _, s := range bal.Servers() {
					got = append(got, s.ID)
				}
			}
			want := slices.Sorted(maps.Keys(c.want[svc]))
			slices.Sort(got)
			st := c.gws[i].Stats()
			fmt.Fprintf(&b, ", e.g. %s lists %v, want %v (events %+v, mirror %+v, lookups %+v)", svc, got, want, st.Events, st.Registry, st.Lookups)
			break
		}
		b.WriteString("; ")
	}
	return b.String()
}

// lists reports whether gw's balancer of service lists exactly ids.
func lists(gw *pushlb.Client, service string, ids map[string]bool) bool {
	b, err := gw.Balancer(service)
	if err != nil {
		return false
	}
	all := b.Servers()
	if len(all) != len(ids) {
		return false
	}
	for _, s := range all {
		if !ids[s.ID] {
			return false
		}
	}
	return true
}

// BenchmarkChurn: 1 % of the fleet is replaced at once (offline events and
// purges of the old instances, puts and online events of their
// replacements, in other services' spread) while the heartbeats run;
// measured from the first offline until every gateway lists exactly the new
// fleet in every service the wave touched. send-ms is the announcers' share:
// the time to send the wave (purges and puts acknowledged).
func BenchmarkChurn(b *testing.B) {
	sz := size(b)
	eachDeployment(b, func(b *testing.B, nb bus) {
		f, recs, _ := loadFleet(b, nb, sz)
		current := f.Generation(0)
		gws := gateways(b, nb, sz.Gateways, nil, nil)
		pub := nb.connect(b)
		hb, stop := fleetHeartbeats(b, nb, f, recs)
		defer stop()
		time.Sleep(window(3*time.Second, 200*time.Millisecond))

		wave := max(1, sz.Total()/100)
		gen, next := 1, 0
		var total, send time.Duration
		for b.Loop() {
			idx := make([]int, 0, wave)
			old := make([]serverlist.Instance, 0, wave)
			news := make([]serverlist.Instance, 0, wave)
			for range wave {
				idx = append(idx, next)
				old = append(old, current[next])
				s, i := next/sz.Instances, next%sz.Instances
				current[next] = f.Instance(s, i, gen)
				news = append(news, current[next])
				next = (next + 97) % len(current) // spread over services
			}
			gen++
			want := map[string]map[string]bool{}
			for _, in := range old {
				want[in.Service] = map[string]bool{}
			}
			for _, in := range current {
				if want[in.Service] != nil {
					want[in.Service][in.InstanceID] = true
				}
			}
			newRecs, err := scale.Encode(news...)
			if err != nil {
				b.Fatal(err)
			}
			conv := newConvergence(gws, want)
			// The replaced instances stop refreshing before they go.
			if err := hb.Replace(b.Context(), idx, nil); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if err := f.Deregister(b.Context(), pub, old...); err != nil {
				b.Fatal(err)
			}
			if err := f.Register(b.Context(), pub, news...); err != nil {
				b.Fatal(err)
			}
			send += time.Since(start)
			if err := hb.Replace(b.Context(), idx, newRecs); err != nil {
				b.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Minute)
			for !conv.done() {
				if time.Now().After(deadline) {
					b.Fatalf("the gateways did not converge within 5 minutes: %v", conv)
				}
				time.Sleep(2 * time.Millisecond)
			}
			total += time.Since(start)
		}
		reportHeartbeats(b, stop(), sz)
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "converge-ms")
		b.ReportMetric(float64(send.Milliseconds())/float64(b.N), "send-ms")
		b.ReportMetric(float64(wave), "replaced")
	})
}
