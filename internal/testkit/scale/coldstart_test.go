package scale_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
)

// BenchmarkColdStartInProcess: a pushlb.Client, configured as the gateway
// binary configures it (reaper on), starts in this process against a
// registry holding the whole fleet (one in-process nats-server); measured
// from New until Start returned (every balancer full), with the live heap
// the started client holds (after a GC, beyond the heap before New). It is
// BenchmarkColdStart without the process, so that a profile shows the
// client alone: with PUSHLB_PROFILE_DIR set, each start writes
// coldstart-cpu.pprof (New to Start's return) and coldstart-heap.pprof
// (after the GC, the client still open) there, for go tool pprof: the
// last start's remain.
// The nats-server shares the process: both profiles include its part,
// which -focus or -ignore set apart.
func BenchmarkColdStartInProcess(b *testing.B) {
	sz := size(b)
	nb := deployments()["single"](b)
	loadFleet(b, nb, sz)
	dir := os.Getenv("PUSHLB_PROFILE_DIR")
	var took time.Duration
	var live uint64
	for b.Loop() {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		nc := nb.connect(b)
		stopCPU := func() {}
		if dir != "" {
			stopCPU = profileCPU(b, filepath.Join(dir, "coldstart-cpu.pprof"))
		}
		start := time.Now()
		c, err := pushlb.New(nc, pushlb.Config{Reaper: true})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
		err = c.Start(ctx)
		cancel()
		took += time.Since(start)
		stopCPU()
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		live = ms.HeapAlloc - min(before, ms.HeapAlloc)
		if dir != "" {
			writeHeap(b, filepath.Join(dir, "coldstart-heap.pprof"))
		}
		if n := routed(c); n != sz.Total() {
			b.Fatalf("the client routes %d instances, want %d", n, sz.Total())
		}
		c.Close()
		nc.Close()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "start-ms")
	b.ReportMetric(float64(live)/1e6, "live-MB")
	b.ReportMetric(float64(sz.Total()), "instances")
}

// routed is the number of servers in the client's balancers.
func routed(c *pushlb.Client) int {
	n := 0
	for _, s := range c.Stats().Services {
		n += s.Servers
	}
	return n
}

// profileCPU starts a CPU profile into path and returns its stop.
func profileCPU(tb testing.TB, path string) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
	}
}

// writeHeap writes a heap profile into path.
func writeHeap(tb testing.TB, path string) {
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}
