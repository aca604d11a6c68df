package gateway

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// syncBenchParallelism is RunParallel's parallelism: this many renewing
// publishers per CPU, each on its own connection, as a fleet's are.
const syncBenchParallelism = 16

// syncWriter is one publisher of the benchmark: its connection, its
// registry and the lease it renews.
type syncWriter struct {
	reg *serverlist.Registry
	id  string
	rev uint64
}

// BenchmarkEmbeddedSync: what each dataSync policy costs a registry
// write on the gateway's embedded server (started by startEmbeddedNATS,
// its store in the benchmark's temporary directory, on whatever disk
// that is). The write is a publisher's lease renewal (RefreshLease, a
// compare-and-set), the registry's most frequent one: one renewal at a
// time (writers=1: the latency of a write, ns/op), then a publisher per
// connection renewing at once (writers=N: ns/op is the wall time per
// write, the inverse of the server's write rate). docs/reliability.md
// holds the figures.
func BenchmarkEmbeddedSync(b *testing.B) {
	for _, policy := range []string{dataSyncAlways, "1s", DefaultDataSync.String()} {
		b.Run("sync="+policy, func(b *testing.B) {
			e, err := startEmbeddedNATS("127.0.0.1:0", b.TempDir(), policy, events.DefaultPrefix, zerolog.Nop())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(e.shutdown)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			b.Cleanup(cancel)
			writers := make([]*syncWriter, syncBenchParallelism*runtime.GOMAXPROCS(0))
			for i := range writers {
				writers[i] = newSyncWriter(ctx, b, e.URL(), fmt.Sprintf("i%d", i))
			}

			b.Run("writers=1", func(b *testing.B) {
				w := writers[0]
				for b.Loop() {
					w.renew(ctx, b)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
			})
			b.Run(fmt.Sprintf("writers=%d", len(writers)), func(b *testing.B) {
				var next atomic.Int64
				b.SetParallelism(syncBenchParallelism)
				b.RunParallel(func(pb *testing.PB) {
					w := writers[next.Add(1)-1] // one goroutine per writer
					for pb.Next() {
						w.renew(ctx, b)
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
			})
		})
	}
}

// newSyncWriter connects a publisher to url, opens the registry as the
// gateway creates it on its embedded server (plain leases) and starts the
// lease of instance id of service "bench".
func newSyncWriter(ctx context.Context, b *testing.B, url, id string) *syncWriter {
	b.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{PlainLeases: true})
	if err != nil {
		b.Fatal(err)
	}
	rev, err := reg.PutLease(ctx, "bench", id, "o")
	if err != nil {
		b.Fatal(err)
	}
	return &syncWriter{reg: reg, id: id, rev: rev}
}

// renew renews the writer's lease once.
func (w *syncWriter) renew(ctx context.Context, b *testing.B) {
	rev, err := w.reg.RefreshLease(ctx, "bench", w.id, "o", w.rev)
	if err != nil {
		b.Error(err)
		return
	}
	w.rev = rev
}
