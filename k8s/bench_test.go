package pushlbk8s_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbk8s "github.com/pushlb/pushlb/k8s"
	"github.com/pushlb/pushlb/k8s/internal/testenv"
)

// BenchmarkBridge measures the bridge on a real control plane, NATS server
// and gateway (pushlb client), in one run (its work is fixed: run it with
// -benchtime=1x):
//
//		cd k8s && go test -run '^$' -bench BenchmarkBridge -benchtime=1x .
//
//	  - ReadyToListed: an endpoint turned ready by an EndpointSlice update →
//	    listed by the gateway, beside the API server's own watch delivery of
//	    that update to a watch of the test (same run, same samples); and an
//	    endpoint turned serving+terminating → gone from the gateway's list.
//	  - RollingUpdate1000: a Service of 1,000 endpoints in 10 slices, every
//	    slice's endpoints replaced by new pods (10 updates, back to back):
//	    the time from the last update to the gateway listing exactly the new
//	    1,000, and the registry writes per endpoint change.
func BenchmarkBridge(b *testing.B) {
	env := testenv.Start(b)
	b.Run("ReadyToListed", func(b *testing.B) { benchReadyToListed(b, env) })
	b.Run("RollingUpdate1000", func(b *testing.B) { benchRollingUpdate(b, env) })
}

// gatewayTimes records when each instance ID joined and left the
// gateway's list of "web", and signals every change.
type gatewayTimes struct {
	mu      sync.Mutex
	in      map[string]bool
	joined  map[string]time.Time
	left    map[string]time.Time
	count   int
	changed chan struct{}
}

func watchGateway(h *harness) *gatewayTimes {
	g := &gatewayTimes{in: map[string]bool{}, joined: map[string]time.Time{}, left: map[string]time.Time{}, changed: make(chan struct{}, 1)}
	stop := h.gw.Watch("web", func(servers []*balancer.Server) {
		now := time.Now()
		g.mu.Lock()
		now2 := map[string]bool{}
		for _, s := range servers {
			now2[s.ID] = true
			if !g.in[s.ID] {
				g.joined[s.ID] = now
			}
		}
		for id := range g.in {
			if !now2[id] {
				g.left[id] = now
			}
		}
		g.in, g.count = now2, len(servers)
		g.mu.Unlock()
		select {
		case g.changed <- struct{}{}:
		default:
		}
	})
	h.t.Cleanup(stop)
	return g
}

// wait waits, on the gateway's signals, until cond holds.
func (g *gatewayTimes) wait(tb testing.TB, what string, cond func(*gatewayTimes) bool) {
	tb.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		g.mu.Lock()
		ok := cond(g)
		g.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-g.changed:
		case <-deadline.C:
			tb.Fatalf("gateway: %s: not within 30 s", what)
		}
	}
}

// apiTimes records when the test's own watch of the namespace's slices saw
// each pod ready, and terminating.
type apiTimes struct {
	mu          sync.Mutex
	ready, term map[string]time.Time
}

func watchAPI(tb testing.TB, env *testenv.Env, ns string) *apiTimes {
	a := &apiTimes{ready: map[string]time.Time{}, term: map[string]time.Time{}}
	w, err := env.Client.DiscoveryV1().EndpointSlices(ns).Watch(tb.Context(), metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			now := time.Now()
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			a.mu.Lock()
			for _, e := range s.Endpoints {
				if e.TargetRef == nil {
					continue
				}
				p := e.TargetRef.Name
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					if _, ok := a.ready[p]; !ok {
						a.ready[p] = now
					}
				}
				if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
					if _, ok := a.term[p]; !ok {
						a.term[p] = now
					}
				}
			}
			a.mu.Unlock()
		}
	}()
	tb.Cleanup(func() { w.Stop(); <-done })
	return a
}

// sliceWriter updates one slice directly (no read before the write), so
// that the time taken before Update is the write's start.
type sliceWriter struct {
	h *harness
	s *discoveryv1.EndpointSlice
}

func newSliceWriter(h *harness, name string, eps ...ep) *sliceWriter {
	h.putSlice(name, "web", eps...)
	s, err := h.kube.DiscoveryV1().EndpointSlices(h.ns).Get(h.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return &sliceWriter{h: h, s: s}
}

func (w *sliceWriter) set(eps ...ep) time.Time {
	s := w.s.DeepCopy()
	s.Endpoints = nil
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready), Serving: ptr(e.serving), Terminating: ptr(e.terminating)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: w.h.ns, Name: e.pod},
		})
	}
	start := time.Now()
	out, err := w.h.kube.DiscoveryV1().EndpointSlices(w.h.ns).Update(w.h.t.Context(), s, metav1.UpdateOptions{})
	if err != nil {
		w.h.t.Fatal(err)
	}
	w.s = out
	return start
}

func benchReadyToListed(b *testing.B, env *testenv.Env) {
	const samples = 200
	h := newHarness(b, env, 0)
	h.service("web", nil)
	base := readyEP("base", "10.20.0.1", "")
	sw := newSliceWriter(h, "web-1", base)
	br := h.startBridge(pushlbk8s.Config{})
	g := watchGateway(h)
	a := watchAPI(b, env, h.ns)
	g.wait(b, "base listed", func(g *gatewayTimes) bool { return g.in[h.id("base")] })
	// The gateway may list a record before the bridge has its write's ack.
	writes0 := waitStats(b, br, "base's write counted", func(s pushlbk8s.Stats) bool { return s.Writes >= 1 }).Writes

	var apiReady, listed, beyond, apiTerm, unlisted, beyondTerm []time.Duration
	for i := range samples {
		pod := fmt.Sprintf("p%d", i)
		id := h.id(pod)
		ip := fmt.Sprintf("10.20.%d.%d", 1+i/250, 1+i%250)
		t0 := sw.set(base, readyEP(pod, ip, ""))
		g.wait(b, pod+" listed", func(g *gatewayTimes) bool { return g.in[id] })
		t1 := sw.set(base, ep{pod: pod, ip: ip, serving: true, terminating: true})
		g.wait(b, pod+" unlisted", func(g *gatewayTimes) bool { return !g.in[id] })
		a.mu.Lock()
		ar, at := a.ready[pod], a.term[pod]
		a.mu.Unlock()
		g.mu.Lock()
		j, l := g.joined[id], g.left[id]
		g.mu.Unlock()
		if ar.IsZero() || at.IsZero() {
			// The test's watch is the API server's delivery: it delivers
			// in order, so it saw the update before the gateway did.
			testutil.Eventually(b, "the test's watch saw "+pod, func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				ar, at = a.ready[pod], a.term[pod]
				return !ar.IsZero() && !at.IsZero()
			})
		}
		apiReady = append(apiReady, ar.Sub(t0))
		listed = append(listed, j.Sub(t0))
		beyond = append(beyond, j.Sub(ar))
		apiTerm = append(apiTerm, at.Sub(t1))
		unlisted = append(unlisted, l.Sub(t1))
		beyondTerm = append(beyondTerm, l.Sub(at))
	}
	writes := br.Stats().Writes - writes0
	report := func(key, name string, d []time.Duration) {
		p50, p99 := testutil.Percentile(d, 0.50), testutil.Percentile(d, 0.99)
		b.ReportMetric(float64(p50.Microseconds())/1000, key+"-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, key+"-p99-ms")
		b.Logf("%-34s p50 %8v  p99 %8v  (%d samples)", name, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), len(d))
	}
	report("api-ready", "ready: API watch delivery", apiReady)
	report("listed", "ready: listed by the gateway", listed)
	report("listed-beyond-api", "ready: listed beyond API delivery", beyond)
	report("api-term", "terminating: API watch delivery", apiTerm)
	report("unlisted", "terminating: unlisted by gateway", unlisted)
	report("unlisted-beyond-api", "terminating: unlisted beyond API", beyondTerm)
	// Per sample: ready (create), drain (update), then the next sample's
	// update removes it (delete): 3 endpoint changes, the last sample's 2.
	b.ReportMetric(float64(writes)/float64(3*samples-1), "writes/change")
	b.Logf("registry writes: %d for %d endpoint changes", writes, 3*samples-1)
}

func benchRollingUpdate(b *testing.B, env *testenv.Env) {
	const slices, perSlice = 10, 100
	h := newHarness(b, env, 0)
	h.service("web", nil)
	gen := func(g, s int) []ep {
		var eps []ep
		for j := range perSlice {
			eps = append(eps, readyEP(fmt.Sprintf("g%d-%d-%d", g, s, j), fmt.Sprintf("10.%d.%d.%d", 40+g, s, j+1), fmt.Sprintf("z%d", j%3)))
		}
		return eps
	}
	writers := make([]*sliceWriter, slices)
	for s := range slices {
		writers[s] = newSliceWriter(h, fmt.Sprintf("web-%d", s), gen(1, s)...)
	}
	g := watchGateway(h)
	started := time.Now()
	br := h.startBridge(pushlbk8s.Config{})
	g.wait(b, "1,000 listed", func(g *gatewayTimes) bool { return g.count == slices*perSlice })
	b.Logf("cold start: 1,000 endpoints listed %v after the bridge started", time.Since(started).Round(time.Millisecond))
	writes0 := waitStats(b, br, "1,000 writes counted", func(s pushlbk8s.Stats) bool { return s.Writes >= slices*perSlice }).Writes

	var last time.Time
	for s := range slices {
		writers[s].set(gen(2, s)...)
		last = time.Now()
	}
	newIDs := map[string]bool{}
	for s := range slices {
		for _, e := range gen(2, s) {
			newIDs[h.id(e.pod)] = true
		}
	}
	g.wait(b, "the new 1,000 listed", func(g *gatewayTimes) bool {
		if g.count != len(newIDs) {
			return false
		}
		for id := range g.in {
			if !newIDs[id] {
				return false
			}
		}
		return true
	})
	conv := time.Since(last)
	testutil.Eventually(b, "the registry holds exactly the new 1,000", func() bool {
		recs := h.records()
		for id := range newIDs {
			if _, ok := recs[id]; !ok {
				return false
			}
		}
		return len(recs) == len(newIDs)
	})
	regConv := time.Since(last) // within the check's 2 ms polling and one listing
	writes := br.Stats().Writes - writes0
	changes := 2 * slices * perSlice // each old endpoint removed, each new one added
	b.ReportMetric(float64(conv.Microseconds())/1000, "converged-after-last-update-ms")
	b.ReportMetric(float64(writes)/float64(changes), "writes/change")
	b.ReportMetric(float64(regConv.Microseconds())/1000, "registry-converged-ms")
	b.Logf("rolling update of 1,000 endpoints in 10 slices: the gateway listed exactly the new ones %v after the last slice update (offline events go first), the registry held exactly them by %v; %d registry writes for %d endpoint changes", conv.Round(time.Millisecond), regConv.Round(time.Millisecond), writes, changes)
}
