package scale_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/natstest"
	"github.com/pushlb/pushlb/internal/scale"
	"github.com/pushlb/pushlb/internal/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// small is what CI runs (every benchmark once); PUSHLB_SCALE=1000x100x20
// gives the figures of docs/perf.md.
var small = scale.Size{Services: 20, Instances: 20, Gateways: 3}

var (
	buildOnce  sync.Once
	gatewayBin string
	buildErr   error
	removeBins = func() {}
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeBins()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// gateway returns the gateway binary, built on first use.
func gateway(tb testing.TB) string {
	buildOnce.Do(func() {
		var bins []string
		bins, removeBins, buildErr = testutil.BuildBinaries("../../cmd/gateway")
		if buildErr == nil {
			gatewayBin = bins[0]
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return gatewayBin
}

func size(tb testing.TB) scale.Size {
	s, err := scale.SizeFromEnv(small)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// full reports whether the run asked for a fleet size of its own: then
// measurement windows are long enough for stable figures.
func full() bool { return os.Getenv("PUSHLB_SCALE") != "" }

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

// loadFleet writes generation 0 of the fleet into the registry.
func loadFleet(b *testing.B, nb bus, sz scale.Size) (*scale.Fleet, time.Duration) {
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	f, err := scale.NewFleet(ctx, nb.connect(b), sz, 10*time.Minute, nb.replicas)
	if err != nil {
		b.Fatal(err)
	}
	recs, err := scale.Encode(f.Generation(0)...)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := f.Put(ctx, recs); err != nil {
		b.Fatal(err)
	}
	return f, time.Since(start)
}

// procStat returns the CPU time and the resident memory of process pid.
func procStat(tb testing.TB, pid int) (cpu time.Duration, rss int64) {
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
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			rss = kb * 1024
		}
	}
	return cpu, rss
}

var serversLine = regexp.MustCompile(`(?m)^pushlb_servers\{service="[^"]+"\} (\d+)$`)

// routed returns the sum of pushlb_servers over the gateway's services.
func routed(tb testing.TB, admin string) int {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, m := range serversLine.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// startGateway runs the gateway binary on nb and waits until /readyz says
// ready: the client's Start returned, which it does once every registered
// instance is in a balancer.
func startGateway(b *testing.B, nb bus) (*testutil.Proc, string, time.Duration) {
	admin, bin := testutil.FreeAddr(b), gateway(b)
	start := time.Now()
	p := testutil.Start(b, bin, "-nats", nb.url, "-listen", testutil.FreeAddr(b), "-admin", admin,
		"-lease", "10m", "-log-level", "warn")
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
// the whole fleet; measured until Start returned (every balancer full), with
// its resident memory then.
func BenchmarkColdStart(b *testing.B) {
	sz := size(b)
	eachDeployment(b, func(b *testing.B, nb bus) {
		_, load := loadFleet(b, nb, sz)
		var total time.Duration
		var rss int64
		for b.Loop() {
			p, admin, took := startGateway(b, nb)
			total += took
			if n := routed(b, admin); n != sz.Total() {
				b.Fatalf("gateway routes %d instances, want %d", n, sz.Total())
			}
			_, rss = procStat(b, p.Pid())
			p.Stop(b, 30*time.Second)
		}
		b.ReportMetric(float64(load.Milliseconds()), "load-ms")
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "start-ms")
		b.ReportMetric(float64(rss)/1e6, "rss-MB")
		b.ReportMetric(float64(sz.Total()), "instances")
	})
}

// BenchmarkHeartbeatCPU: the fleet refreshes its leases every 10 s with
// unchanged content; the gateway's CPU over the window, as a share of one
// core, and its resident memory before and after.
func BenchmarkHeartbeatCPU(b *testing.B) {
	sz := size(b)
	window := time.Second
	if full() {
		window = 20 * time.Second
	}
	eachDeployment(b, func(b *testing.B, nb bus) {
		f, _ := loadFleet(b, nb, sz)
		recs, err := scale.Encode(f.Generation(0)...)
		if err != nil {
			b.Fatal(err)
		}
		p, admin, _ := startGateway(b, nb)
		var cpuShare float64
		var rss0, rss1 int64
		var puts int
		for b.Loop() {
			cpu0, r0 := procStat(b, p.Pid())
			ctx, cancel := context.WithTimeout(b.Context(), window)
			start := time.Now()
			n, err := f.Heartbeats(ctx, recs, 10*time.Second)
			cancel()
			elapsed := time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			cpu1, r1 := procStat(b, p.Pid())
			cpuShare = (cpu1 - cpu0).Seconds() / elapsed.Seconds()
			rss0, rss1, puts = r0, r1, n
		}
		if n := routed(b, admin); n != sz.Total() {
			b.Fatalf("after the heartbeats the gateway routes %d instances, want %d", n, sz.Total())
		}
		b.ReportMetric(100*cpuShare, "cpu-%")
		b.ReportMetric(float64(puts)/window.Seconds(), "puts/s")
		b.ReportMetric(float64(rss0)/1e6, "rss0-MB")
		b.ReportMetric(float64(rss1)/1e6, "rss1-MB")
		p.Stop(b, 30*time.Second)
	})
}

// gateways starts n in-process clients, each on its own connection, with
// the fleet loaded.
func gateways(b *testing.B, nb bus, n int) []*pushlb.Client {
	out := make([]*pushlb.Client, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		c, err := pushlb.New(nb.connect(b), pushlb.WithServiceGrace(time.Hour))
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

// BenchmarkPropagation: one instance registers and announces itself online
// while the fleet's heartbeats run; the time until each of the gateways
// lists it, next to a raw NATS hop to as many subscribers in the same run.
func BenchmarkPropagation(b *testing.B) {
	sz := size(b)
	eachDeployment(b, func(b *testing.B, nb bus) {
		f, _ := loadFleet(b, nb, sz)
		recs, err := scale.Encode(f.Generation(0)...)
		if err != nil {
			b.Fatal(err)
		}
		gws := gateways(b, nb, sz.Gateways)
		hbCtx, stopHB := context.WithCancel(b.Context())
		var hb sync.WaitGroup
		hb.Go(func() { f.Heartbeats(hbCtx, recs, 10*time.Second) })
		defer func() { stopHB(); hb.Wait() }()

		// Each gateway reports when svc-0's list gains or loses the probe.
		type seen struct {
			gw int
			at time.Time
		}
		ch := make(chan seen, 4*sz.Gateways)
		var probe sync.Map // the probe's current ID
		for i, c := range gws {
			bal, err := c.Balancer(scale.ServiceName(0))
			if err != nil {
				b.Fatal(err)
			}
			bal.AddListener(func(_, cur []*balancer.Server) {
				id, _ := probe.Load("id")
				if slices.ContainsFunc(cur, func(s *balancer.Server) bool { return s.ID == id }) {
					ch <- seen{i, time.Now()}
				}
			})
		}
		pub := nb.connect(b)
		raw := make(chan time.Time, sz.Gateways)
		for range sz.Gateways {
			sub, err := nb.connect(b).Subscribe("raw.hop", func(*nats.Msg) { raw <- time.Now() })
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Unsubscribe()
		}
		var pushLat, rawLat []time.Duration
		gen := 1
		for b.Loop() {
			in := f.Instance(0, 0, gen)
			gen++
			probe.Store("id", in.InstanceID)
			start := time.Now()
			if err := f.Register(b.Context(), pub, in); err != nil {
				b.Fatal(err)
			}
			for range sz.Gateways {
				s := testutil.Receive(b, ch, time.Minute, "a gateway to list the probe")
				pushLat = append(pushLat, s.at.Sub(start))
			}
			start = time.Now()
			pub.Publish("raw.hop", nil)
			for range sz.Gateways {
				rawLat = append(rawLat, testutil.Receive(b, raw, time.Minute, "the raw hop").Sub(start))
			}
			if err := f.Deregister(b.Context(), pub, in); err != nil {
				b.Fatal(err)
			}
		}
		report := func(d []time.Duration, unit string) {
			b.ReportMetric(float64(testutil.Percentile(d, 0.5).Microseconds()), unit+"-p50-µs")
			b.ReportMetric(float64(testutil.Percentile(d, 0.99).Microseconds()), unit+"-p99-µs")
		}
		report(pushLat, "push")
		report(rawLat, "raw")
	})
}

// converged reports whether every gateway lists exactly want (IDs by
// service) for the services of want.
func converged(gws []*pushlb.Client, want map[string]map[string]bool) bool {
	for _, c := range gws {
		for svc, ids := range want {
			b, err := c.Balancer(svc)
			if err != nil {
				return false
			}
			all := b.AllServers()
			if len(all) != len(ids) {
				return false
			}
			for _, s := range all {
				if !ids[s.ID] {
					return false
				}
			}
		}
	}
	return true
}

// BenchmarkChurn: 1 % of the fleet is replaced at once (offline and
// deregistered, new instances registered and online) while the heartbeats
// run; measured until every gateway lists exactly the new fleet.
func BenchmarkChurn(b *testing.B) {
	sz := size(b)
	eachDeployment(b, func(b *testing.B, nb bus) {
		f, _ := loadFleet(b, nb, sz)
		current := f.Generation(0)
		recs, err := scale.Encode(current...)
		if err != nil {
			b.Fatal(err)
		}
		gws := gateways(b, nb, sz.Gateways)
		hbCtx, stopHB := context.WithCancel(b.Context())
		var hb sync.WaitGroup
		hb.Go(func() { f.Heartbeats(hbCtx, recs, 10*time.Second) })
		defer func() { stopHB(); hb.Wait() }()
		pub := nb.connect(b)
		wave := max(1, sz.Total()/100)
		gen, next := 1, 0
		var total time.Duration
		for b.Loop() {
			var gone, fresh []int
			for range wave {
				gone = append(gone, next)
				next = (next + 97) % len(current) // spread over services
			}
			old := make([]serverlist.Instance, 0, wave)
			for _, k := range gone {
				old = append(old, current[k])
			}
			for _, k := range gone {
				s, i := k/sz.Instances, k%sz.Instances
				current[k] = f.Instance(s, i, gen)
				fresh = append(fresh, k)
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
			news := make([]serverlist.Instance, 0, wave)
			for _, k := range fresh {
				news = append(news, current[k])
			}
			start := time.Now()
			if err := f.Deregister(b.Context(), pub, old...); err != nil {
				b.Fatal(err)
			}
			if err := f.Register(b.Context(), pub, news...); err != nil {
				b.Fatal(err)
			}
			testutil.EventuallyWithin(b, 5*time.Minute, "every gateway to converge", func() bool { return converged(gws, want) })
			total += time.Since(start)
		}
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "converge-ms")
		b.ReportMetric(float64(wave), "replaced")
	})
}
