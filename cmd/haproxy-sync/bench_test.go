package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// benchRig is HAProxy fed by haproxy-sync, a NATS server, and a steady
// load through HAProxy's frontend, for the figures of docs/haproxy.md.
type benchRig struct {
	ns     *natstest.Server
	h      *haproxy
	sync   *syncRun
	client *http.Client
	sent   atomic.Int64
	failed atomic.Int64
}

func newBenchRig(b *testing.B, advisories bool, backends string) *benchRig {
	b.Helper()
	var opts []natstest.Option
	if advisories {
		opts = append(opts, natstest.WithAdvisories(b, "lb"))
	}
	r := &benchRig{ns: natstest.Start(b, opts...)}
	r.h = startHAProxy(b, haproxyConfig{backends: ordersBackend + backends, frontend: "orders"})
	r.sync = startSync(b, "-nats", r.ns.URL(), "-socket", r.h.sock, "-drain-timeout", "5s", "orders")
	r.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(r.client.CloseIdleConnections)
	return r
}

// load sends requests through HAProxy from workers goroutines until the
// returned stop is called, counting those that fail (an error or a status
// other than 200).
func (r *benchRig) load(workers int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				r.sent.Add(1)
				if code, _, err := get(r.client, r.h.url("/x")); err != nil || code != 200 {
					r.failed.Add(1)
				}
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// waitRouted waits until HAProxy sent requests to the instance.
func (r *benchRig) waitRouted(b *testing.B, l *backend) {
	b.Helper()
	testutil.Eventually(b, "requests reach "+l.id, func() bool { return l.hits.Load() > 0 })
}

// waitGone waits until the instance's server left the backend.
func (r *benchRig) waitGone(b *testing.B, id string) {
	b.Helper()
	r.h.waitServers(b, "orders", id+" deleted", func(s map[string]*haServer) bool { return s[defaultNamePrefix+id] == nil })
}

// departures measures b.N departures beside two instances that stay,
// under a load of 4 workers: each iteration calls arrive (untimed), which
// starts the i-th instance, waits until HAProxy routes to it and returns
// its ID and its departure; it times the departure, which returns the
// sample, then waits the instance out of the backend. It reports the
// samples and the failed requests.
func (r *benchRig) departures(b *testing.B, arrive func(i int) (id string, depart func() time.Duration)) {
	announce(b, r.ns, "orders", "stay-1", "", 0)
	announce(b, r.ns, "orders", "stay-2", "", 0)
	r.h.waitServers(b, "orders", "2 instances", func(s map[string]*haServer) bool { return len(ours(s)) == 2 })
	stop := r.load(4)
	defer stop()
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		id, depart := arrive(i)
		b.StartTimer()
		samples = append(samples, depart())
		b.StopTimer()
		r.waitGone(b, id)
	}
	stop()
	reportTimes(b, samples)
	b.ReportMetric(float64(r.failed.Load()), "failed")
}

// inProcess is an arrive of departures: an in-process backend announced
// as prefix-i, routed; depart takes it away and returns the sample.
func (r *benchRig) inProcess(b *testing.B, prefix string, depart func(l *backend) time.Duration) func(i int) (string, func() time.Duration) {
	return func(i int) (string, func() time.Duration) {
		l := announce(b, r.ns, "orders", fmt.Sprintf("%s-%d", prefix, i), "", 0)
		r.waitRouted(b, l)
		return l.id, func() time.Duration { return depart(l) }
	}
}

func reportTimes(b *testing.B, samples []time.Duration) {
	b.ReportMetric(float64(testutil.Percentile(samples, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(testutil.Percentile(samples, 0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(testutil.Percentile(samples, 1).Microseconds())/1000, "max-ms")
}

// BenchmarkHAProxy measures, with a real HAProxy fed by haproxy-sync and
// two instances that stay, each under a steady load through HAProxy (4
// clients):
//
//   - graceful: one iteration announces an instance, waits until HAProxy
//     sends it requests, withdraws it (its offline event), and measures the
//     time from the withdrawal to the last request HAProxy sent it (0 when
//     none came after);
//   - crash: one iteration announces an instance, then closes its listener
//     and its publisher's NATS connection at once (what a SIGKILL of announce
//     and its backend does to their sockets), and measures the time until
//     HAProxy no longer picks it: its server in maintenance or deleted, as
//     "show servers state" tells, read in a loop; the requests HAProxy
//     sent it meanwhile are retried on another server (retries,
//     redispatch), so "failed" is expected to stay 0;
//   - crash-process: the same with real processes, announce (hold mode)
//     and testbackend, both killed with SIGKILL (not in -short: it builds
//     them);
//   - rolling: one iteration restarts 4 instances one after the other
//     (withdraw, wait until HAProxy deleted the drained server, stop it,
//     start it again on a new port under the same ID), and reports the
//     failed requests of the whole load (0 expected).
func BenchmarkHAProxy(b *testing.B) {
	b.Run("graceful", func(b *testing.B) {
		r := newBenchRig(b, false, "")
		r.departures(b, r.inProcess(b, "g", func(l *backend) time.Duration {
			t0 := time.Now()
			l.withdraw(b)
			r.waitGone(b, l.id)
			return max(0, time.Duration(l.last.Load()-t0.UnixNano()))
		}))
	})
	b.Run("crash", func(b *testing.B) {
		r := newBenchRig(b, true, "")
		r.departures(b, r.inProcess(b, "c", func(l *backend) time.Duration {
			name := defaultNamePrefix + l.id
			t0 := time.Now()
			l.crash()
			r.h.waitServers(b, "orders", l.id+" out of the picks", func(s map[string]*haServer) bool { return s[name] == nil || s[name].maint() })
			return time.Since(t0)
		}))
	})
	b.Run("crash-process", func(b *testing.B) {
		if testing.Short() {
			b.Skip("builds announce and testbackend: not in -short")
		}
		bins, remove, err := testutil.BuildBinaries("../announce", "../../internal/testkit/testbackend")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(remove)
		r := newBenchRig(b, true, "")
		r.departures(b, func(i int) (string, func() time.Duration) {
			id := fmt.Sprintf("p-%d", i)
			addr := testutil.FreeAddr(b)
			backend := testutil.Start(b, bins[1], "-addr", addr, "-name", id)
			ann := testutil.Start(b, bins[0], "-nats", r.ns.URL(), "-service", "orders", "-addr", addr, "-id", id, "-health-interval", "0")
			name := defaultNamePrefix + id
			r.h.waitServers(b, "orders", id+" added", func(s map[string]*haServer) bool { return s[name] != nil && !s[name].maint() })
			return id, func() time.Duration {
				t0 := time.Now()
				ann.Kill(b)
				backend.Kill(b)
				r.h.waitServers(b, "orders", id+" out of the picks", func(s map[string]*haServer) bool { return s[name] == nil || s[name].maint() })
				return time.Since(t0)
			}
		})
	})
	b.Run("rolling", func(b *testing.B) {
		r := newBenchRig(b, false, "")
		ids := []string{"r-0", "r-1", "r-2", "r-3"}
		live := map[string]*backend{}
		for _, id := range ids {
			live[id] = announce(b, r.ns, "orders", id, "", 0)
		}
		r.h.waitServers(b, "orders", "4 instances", func(s map[string]*haServer) bool { return len(ours(s)) == 4 })
		stop := r.load(4)
		defer stop()
		b.ResetTimer()
		for range b.N {
			for _, id := range ids {
				old := live[id]
				old.withdraw(b)
				r.waitGone(b, id)
				old.srv.Close()
				_ = old.pub.Close()
				live[id] = announce(b, r.ns, "orders", id, "", 0)
				r.h.waitServers(b, "orders", id+" back", func(s map[string]*haServer) bool {
					srv := s[defaultNamePrefix+id]
					return srv != nil && !srv.maint() && !srv.draining()
				})
			}
		}
		b.StopTimer()
		stop()
		b.ReportMetric(float64(r.failed.Load()), "failed")
		b.ReportMetric(float64(r.sent.Load()), "requests")
	})
}

// BenchmarkHAProxyRequests compares HAProxy's throughput over 3 backends
// written statically in haproxy.cfg (static) and over the same 3 announced
// and added by haproxy-sync (pushlb): the sync must not touch the data
// path. Run with -count to interleave the two.
func BenchmarkHAProxyRequests(b *testing.B) {
	ns := natstest.Start(b)
	var backs []*backend
	var static strings.Builder
	static.WriteString("backend fixed\n  balance roundrobin\n")
	for i := range 3 {
		bk := announce(b, ns, "orders", fmt.Sprintf("q-%d", i), "", 0)
		backs = append(backs, bk)
		fmt.Fprintf(&static, "  server s%d %s weight 26\n", i, bk.srv.Listener.Addr())
	}
	port := testutil.FreePort(b)
	extra := fmt.Sprintf("frontend fe_fixed\n  bind 127.0.0.1:%d\n  default_backend fixed\n%s", port, static.String())
	h := startHAProxy(b, haproxyConfig{backends: ordersBackend + extra, frontend: "orders"})
	startSync(b, "-nats", ns.URL(), "-socket", h.sock, "orders")
	h.waitServers(b, "orders", "3 instances", func(s map[string]*haServer) bool { return len(ours(s)) == 3 })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(client.CloseIdleConnections)
	urls := map[string]string{"static": fmt.Sprintf("http://127.0.0.1:%d/x", port), "pushlb": h.url("/x")}
	for _, name := range []string{"static", "pushlb"} {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism(4)
			testutil.GetLoad(b, client, urls[name], true)
		})
	}
}
