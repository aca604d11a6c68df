package serverlist_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pushlb/pushlb/serverlist"
)

const benchInstances = 1000

// benchMirror returns a synced mirror of 10 services x 100 instances. With
// metadata each Get copies a small map (one allocation); without, none.
func benchMirror(b *testing.B, metadata bool) (*serverlist.Registry, *serverlist.Mirror) {
	b.Helper()
	e := newEnv(b, serverlist.RegistryConfig{})
	ins := make([]serverlist.Instance, 0, benchInstances)
	for i := range benchInstances {
		in := inst(fmt.Sprintf("svc%d", i%10), fmt.Sprintf("10.0.%d.%d:svc:8080", i/256, i%256), 8080)
		if !metadata {
			in.Metadata = nil
		}
		ins = append(ins, in)
	}
	register(b, e.reg, ins...)
	m := startMirror(b, e.reg, serverlist.MirrorConfig{})
	if n := m.Stats().Instances; n != benchInstances {
		b.Fatalf("mirror holds %d instances", n)
	}
	return e.reg, m
}

func BenchmarkMirrorGet(b *testing.B) {
	for _, md := range []bool{false, true} {
		b.Run(fmt.Sprintf("metadata=%v", md), func(b *testing.B) {
			_, m := benchMirror(b, md)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, ok := m.Get("svc3", "10.0.0.3:svc:8080"); !ok {
						b.Fatal("miss")
					}
					i++
				}
			})
		})
	}
}

// BenchmarkLookup measures a hit in the mirror (a map read) and a miss the
// registry answers (one direct KV get on the in-process server).
func BenchmarkLookup(b *testing.B) {
	for _, withMirror := range []bool{true, false} {
		name := map[bool]string{true: "hit", false: "fallback"}[withMirror]
		b.Run(name, func(b *testing.B) {
			reg, m := benchMirror(b, false)
			if !withMirror {
				m = nil
			}
			l, err := serverlist.NewLookup(reg, m, serverlist.LookupConfig{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := testCtx(b, time.Hour)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := l.Resolve(ctx, "svc3", "10.0.0.3:svc:8080"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
