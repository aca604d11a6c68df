package scale_test

import (
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

const (
	// trafficRequests is the number of requests in the measured window,
	// trafficWarmup the number sent before it: keep-alive connections
	// opened on both sides, the gateway's client of the service built, the
	// start's garbage collected.
	trafficRequests = 200_000
	trafficWarmup   = 40_000
	// trafficClients is the number of concurrent keep-alive clients.
	trafficClients = 4
)

// trafficBody is what the backend answers: a small API response.
var trafficBody = []byte(`{"id":"0000000000000000","status":"ok","items":[1,2,3,4,5,6,7,8],"note":"a small API response of the traffic benchmark"}` + "\n")

// BenchmarkLoadedGatewayTraffic: a gateway holding the whole fleet (bare
// records, as BenchmarkColdStart loads them) serves requests to one more
// service, whose one instance is a real HTTP backend in this process,
// registered in the same registry the same way. Once the gateway is ready
// and trafficWarmup requests went through, trafficRequests are sent
// through its listen address to /<service>/ by trafficClients concurrent
// keep-alive clients. Measured for the gateway process alone, over that
// window: its CPU (user+sys from /proc/<pid>/stat) per request, the
// requests per second, its GC cycles (go_gc_duration_seconds_count) and
// the heap bytes it allocated per request (go_memstats_alloc_bytes_total),
// its peak resident memory (VmHWM, reset at the window's start), its heap
// in use at the end, and the p50/p99 of the requests' latencies at the
// clients. PUSHLB_GATEWAY_GOMEMLIMIT=80MiB runs the gateway with
// GOMEMLIMIT=80MiB (limit-MiB reports the limit the gateway's runtime
// holds, 0 for none): docs/perf/memory.md, "A memory limit under traffic".
//
// The gateway runs with -reaper=false: the leading reaper's first sweep
// follows its start and would land in the window; a gateway that does not
// lead the reapers routes as one that does.
//
// It skips without PUSHLB_SCALE: at CI's small size the figures say
// nothing about a memory limit near a large live heap.
func BenchmarkLoadedGatewayTraffic(b *testing.B) {
	if !full() {
		b.Skip("PUSHLB_SCALE unset: the traffic through a loaded gateway is measured at a size of its own")
	}
	sz := size(b)
	nb := deployments()["single"](b)
	f, _, _ := loadFleet(b, nb, sz)

	var served atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write(trafficBody)
	}))
	defer backend.Close()
	_, port, err := net.SplitHostPort(backend.Listener.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	// The service after the fleet's last, its instance as the fleet's are
	// but at the backend's address.
	in := f.Instance(sz.Services, 0, 0)
	in.Host = "127.0.0.1"
	if in.Port, err = strconv.Atoi(port); err != nil {
		b.Fatal(err)
	}
	recs, err := scale.Encode(in)
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Put(b.Context(), recs); err != nil {
		b.Fatal(err)
	}
	gateway(b)

	var w trafficWindow
	var limit float64
	for b.Loop() {
		listen := testutil.FreeAddr(b)
		p, admin, _ := startGatewayOn(b, nb, listen, "-reaper=false")
		m := scrape(b, admin)
		if m.routed != sz.Total()+1 {
			b.Fatalf("gateway routes %d instances, want %d", m.routed, sz.Total()+1)
		}
		if m.memLimit < math.MaxInt64 {
			limit = m.memLimit
		}
		client := &http.Client{Transport: &http.Transport{
			Proxy: nil, MaxIdleConnsPerHost: trafficClients, DisableCompression: true,
		}}
		url := "http://" + listen + "/" + in.Service + "/items/0"
		served.Store(0)
		if _, err := drive(client, url, trafficWarmup, trafficClients); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
		w = measureTraffic(b, p, admin, client, url)
		if got, want := served.Load(), int64(trafficWarmup+trafficRequests); got != want {
			b.Fatalf("the backend served %d requests, want %d", got, want)
		}
		client.CloseIdleConnections()
		p.Stop(b, 30*time.Second)
	}
	b.ReportMetric(w.cpu.Seconds()*1e6/trafficRequests, "cpu-µs/req")
	b.ReportMetric(trafficRequests/w.elapsed.Seconds(), "req/s")
	b.ReportMetric(w.cpu.Seconds()/w.elapsed.Seconds(), "cores")
	b.ReportMetric(w.gcs, "gcs")
	b.ReportMetric(w.allocated/trafficRequests, "alloc-B/req")
	b.ReportMetric(float64(w.peak)/1e6, "peak-MB")
	b.ReportMetric(w.heap/1e6, "heap-MB")
	b.ReportMetric(float64(testutil.Percentile(w.lat, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(testutil.Percentile(w.lat, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(limit/(1<<20), "limit-MiB")
	b.ReportMetric(float64(sz.Total()), "instances")
}

// trafficWindow is what measureTraffic saw of the gateway over its window.
type trafficWindow struct {
	elapsed, cpu   time.Duration
	gcs, allocated float64 // GC cycles, heap bytes allocated
	peak           int64   // peak resident memory, bytes
	heap           float64 // heap in use at the end, bytes
	lat            []time.Duration
}

// measureTraffic sends trafficRequests to url and returns what the gateway
// process p (admin address admin) spent on them. The scrapes of its
// /metrics, which cost it CPU, stay outside the window.
func measureTraffic(b *testing.B, p *testutil.Proc, admin string, client *http.Client, url string) trafficWindow {
	m0 := scrape(b, admin)
	resetPeak(b, p.Pid())
	cpu0, _ := procStat(b, p.Pid())
	start := time.Now()
	lat, err := drive(client, url, trafficRequests, trafficClients)
	elapsed := time.Since(start)
	cpu1, _, peak := procStatPeak(b, p.Pid())
	if err != nil {
		b.Fatal(err)
	}
	m1 := scrape(b, admin)
	return trafficWindow{
		elapsed: elapsed, cpu: cpu1 - cpu0,
		gcs: m1.gcs - m0.gcs, allocated: m1.allocated - m0.allocated,
		peak: peak, heap: m1.heap, lat: lat,
	}
}

// resetPeak resets the peak resident memory (VmHWM) of process pid to its
// resident memory now, so that the next read of VmHWM is the peak since.
func resetPeak(tb testing.TB, pid int) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		tb.Fatalf("reset the peak resident memory: %v", err)
	}
}

// drive sends n GETs to url from clients goroutines sharing client (each
// keeps its keep-alive connection) and returns every request's latency,
// or the first failure: an error or a status other than 200.
func drive(client *http.Client, url string, n, clients int) ([]time.Duration, error) {
	var next atomic.Int64
	var failed atomic.Bool
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
		failed.Store(true)
	}
	all := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			lat := make([]time.Duration, 0, n/clients+1)
			defer func() {
				mu.Lock()
				all = append(all, lat...)
				mu.Unlock()
			}()
			for next.Add(1) <= int64(n) && !failed.Load() {
				t0 := time.Now()
				resp, err := client.Get(url)
				if err != nil {
					fail(err)
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil {
					fail(err)
					return
				}
				if resp.StatusCode != http.StatusOK {
					fail(fmt.Errorf("GET %s: %s", url, resp.Status))
					return
				}
				lat = append(lat, time.Since(t0))
			}
		})
	}
	wg.Wait()
	return all, firstErr
}
