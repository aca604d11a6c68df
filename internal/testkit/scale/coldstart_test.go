package scale_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/serverlist"
)

// BenchmarkColdStartInProcess: a pushlb.Client that routes and does not
// reap (the leading reaper's watch of every lease, which the gateway
// binary runs, goes on after Start returns and would blur the heap
// figures: BenchmarkColdStart includes it), starts in this process against a
// registry holding the whole fleet (one in-process nats-server), its
// records bare (as scale.Fleet writes them) or as announce writes them
// (owner, connection, gossip node, a label: see announced); measured
// from New until Start returned (every balancer full), with the live heap
// the started client holds (after a GC, beyond the heap before New; and
// client-MB, the part the nats-server did not allocate: see clientHeap). It is
// BenchmarkColdStart without the process, so that a profile shows the
// client alone: with PUSHLB_PROFILE_DIR set, each start writes
// <shape>-cpu.pprof (New to Start's return) and <shape>-heap.pprof
// (after the GC, the client still open) there, for go tool pprof: the
// last start's remain.
// The nats-server shares the process: both profiles include its part,
// which -focus or -ignore set apart.
func BenchmarkColdStartInProcess(b *testing.B) {
	// A finer heap profile than the default (one sample per 512 KiB), so
	// that client-MB and the profiles' sites hold to a few percent; set
	// before the client allocates anything, and restored for the
	// benchmarks that follow.
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 16 << 10
	sz := size(b)
	for _, shape := range []struct {
		name   string
		record func(in *serverlist.Instance, i int)
	}{{"bare", nil}, {"announce", announced}} {
		b.Run(shape.name, func(b *testing.B) {
			nb := deployments()["single"](b)
			loadRecords(b, nb, sz, shape.record)
			coldStartInProcess(b, nb, sz, shape.name)
		})
	}
}

// announced makes in, the i-th instance of the fleet, a record as announce
// writes it: its process's owner token, the NATS connection it holds (one
// of three servers), its gossip node (named as gossip names an instance's
// by default), and a label.
func announced(in *serverlist.Instance, i int) {
	in.Owner = fmt.Sprintf("%032x", i)
	in.NATSServerID = fmt.Sprintf("NDRS%052d", i%3)
	in.NATSClientID = uint64(1000 + i)
	in.GossipNode = gossip.DefaultNodeName(gossip.Meta{Role: gossip.RoleInstance, Service: in.Service, InstanceID: in.InstanceID, Incarnation: in.Incarnation})
	in.GossipAddr = in.Host + ":7946"
	in.Metadata = map[string]string{"version": "1.4." + strconv.Itoa(i%2)}
}

// loadRecords writes generation 0 of the fleet as loadFleet does, each
// record first passed to shape when set.
func loadRecords(tb testing.TB, nb bus, sz scale.Size, shape func(in *serverlist.Instance, i int)) {
	ctx, cancel := context.WithTimeout(tb.Context(), 5*time.Minute)
	defer cancel()
	f, err := scale.NewFleet(ctx, nb.connect(tb), sz, 10*time.Minute, nb.replicas)
	if err != nil {
		tb.Fatal(err)
	}
	ins := f.Generation(0)
	if shape != nil {
		for i := range ins {
			shape(&ins[i], i)
		}
	}
	recs, err := scale.Encode(ins...)
	if err != nil {
		tb.Fatal(err)
	}
	if err := f.Put(ctx, recs); err != nil {
		tb.Fatal(err)
	}
}

func coldStartInProcess(b *testing.B, nb bus, sz scale.Size, name string) {
	dir := profileDir(b)
	var took time.Duration
	var live uint64
	var client float64
	for b.Loop() {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		nc := nb.connect(b)
		stopCPU := func() {}
		if dir != "" {
			stopCPU = profileCPU(b, filepath.Join(dir, name+"-cpu.pprof"))
		}
		start := time.Now()
		c, err := pushlb.New(nc, pushlb.Config{Follow: pushlb.FollowAll})
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
		runtime.GC() // the heap profile is as of the last GC's end
		runtime.ReadMemStats(&ms)
		live = ms.HeapAlloc - min(before, ms.HeapAlloc)
		client = clientHeap()
		if dir != "" {
			writeHeap(b, filepath.Join(dir, name+"-heap.pprof"))
		}
		if n := routed(c); n != sz.Total() {
			b.Fatalf("the client routes %d instances, want %d", n, sz.Total())
		}
		c.Close()
		nc.Close()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "start-ms")
	b.ReportMetric(float64(live)/1e6, "live-MB")
	b.ReportMetric(client/1e6, "client-MB")
	b.ReportMetric(float64(sz.Total()), "instances")
}

// clientHeap estimates, from the runtime's heap profile (sampled, scaled
// back as pprof does), the bytes in use that the nats-server sharing the
// process did not allocate: the client's (pushlb, nats.go, the runtime
// around them). The live heap beside it also counts what the server holds
// in caches that come and go (its message blocks, read during the sync).
func clientHeap() float64 {
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	rate := float64(runtime.MemProfileRate)
	var total float64
	for _, r := range recs {
		if r.InUseBytes() == 0 || r.AllocObjects == 0 || fromServer(r.Stack()) {
			continue
		}
		size := float64(r.AllocBytes) / float64(r.AllocObjects)
		total += float64(r.InUseBytes()) / (1 - math.Exp(-size/rate))
	}
	return total
}

// fromServer reports whether a stack runs in the nats-server.
func fromServer(stack []uintptr) bool {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "nats-io/nats-server") {
			return true
		}
		if !more {
			return false
		}
	}
}

// profileDir returns PUSHLB_PROFILE_DIR, created when missing, or "" when
// it is not set.
func profileDir(tb testing.TB) string {
	dir := os.Getenv("PUSHLB_PROFILE_DIR")
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatalf("PUSHLB_PROFILE_DIR: %v", err)
		}
	}
	return dir
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

// liveHeap asks a gateway run with -pprof for a heap profile after a GC
// (which the request makes it run), saves it as <name>-heap.pprof under
// PUSHLB_PROFILE_DIR when set, and returns the heap in use then (bytes):
// the live heap, with the fragmentation of its spans.
func liveHeap(tb testing.TB, admin, name string) float64 {
	resp, err := http.Get("http://" + admin + "/debug/pprof/heap?gc=1")
	if err != nil {
		tb.Fatal(err)
	}
	prof, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("heap profile: %v (status %d)", err, resp.StatusCode)
	}
	if dir := profileDir(tb); dir != "" {
		file := strings.NewReplacer("/", "-", " ", "-").Replace(name) + "-heap.pprof"
		if err := os.WriteFile(filepath.Join(dir, file), prof, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return scrape(tb, admin).heap
}
