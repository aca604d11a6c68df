package balancer

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// benchOneZone builds a balancer of rule over n servers of one zone,
// without zone narrowing (Filter None, ZoneAware off), so that a benchmark
// measures the rule alone. A third of the servers are idle, the others
// have one or two requests in flight, so the least loaded are many.
func benchOneZone(b *testing.B, rule Rule, n int) *Balancer {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Filter = FilterNone
	cfg.ZoneAware = false
	bal, err := New("bench", cfg, WithRule(rule))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bal.Close() })
	list := make([]Server, n)
	for i := range list {
		list[i] = Server{ID: fmt.Sprintf("i-%d", i), Host: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256), Port: 8080}
	}
	if err := bal.SetServers(list); err != nil {
		b.Fatal(err)
	}
	for i, s := range bal.AllServers() {
		for range i % 3 {
			bal.Begin(s)
		}
	}
	return bal
}

// benchKeys are contexts with distinct keys, cycled through by keyed
// benchmarks so that the lookups do not all hit one cache line.
func benchKeys() []context.Context {
	out := make([]context.Context, 1024)
	for i := range out {
		out[i] = WithKey(context.Background(), fmt.Sprintf("user-%d", i))
	}
	return out
}

func runChoose(b *testing.B, bal *Balancer, ctxs []context.Context) {
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := bal.Choose(ctxs[i&(len(ctxs)-1)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if _, err := bal.Choose(ctxs[i&(len(ctxs)-1)]); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}

// BenchmarkLeastLoaded measures a pick of BestAvailable (exact, a tree of
// active counts) and LeastRequest (two random choices), the rule alone.
func BenchmarkLeastLoaded(b *testing.B) {
	rules := []struct {
		name string
		new  func() Rule
	}{
		{RuleBestAvailable, func() Rule { return NewBestAvailable() }},
		{RuleLeastRequest, func() Rule { return NewLeastRequest() }},
		{RuleRoundRobin, func() Rule { return NewRoundRobin() }}, // the floor
	}
	for _, r := range rules {
		for _, n := range benchSizes {
			bal := benchOneZone(b, r.new(), n)
			b.Run(fmt.Sprintf("%s/N=%d", r.name, n), func(b *testing.B) {
				runChoose(b, bal, []context.Context{context.Background()})
			})
		}
	}
}

// BenchmarkLeastLoadedPick measures a reported pick, Pick then Done, as
// lbhttp makes one: for BestAvailable it includes keeping the tree current
// at the request's start and end.
func BenchmarkLeastLoadedPick(b *testing.B) {
	rules := []struct {
		name string
		new  func() Rule
	}{
		{RuleBestAvailable, func() Rule { return NewBestAvailable() }},
		{RuleLeastRequest, func() Rule { return NewLeastRequest() }},
		{RuleRoundRobin, func() Rule { return NewRoundRobin() }},
	}
	for _, r := range rules {
		for _, n := range benchSizes {
			bal := benchOneZone(b, r.new(), n)
			ctx := context.Background()
			b.Run(fmt.Sprintf("%s/N=%d/serial", r.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					p, err := bal.Pick(ctx)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(DoneInfo{ResponseTime: time.Millisecond})
				}
			})
			b.Run(fmt.Sprintf("%s/N=%d/parallel", r.name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						p, err := bal.Pick(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						p.Done(DoneInfo{ResponseTime: time.Millisecond})
					}
				})
			})
		}
	}
}

// BenchmarkKeyed measures a keyed pick: Maglev (the Rendezvous and Maglev
// rules) against the Rendezvous type's scan, 1,024 keys in turn.
func BenchmarkKeyed(b *testing.B) {
	ctxs := benchKeys()
	rules := []struct {
		name string
		new  func() Rule
	}{
		{RuleMaglev, func() Rule { return NewMaglev() }},
		{"RendezvousScan", func() Rule { return NewRendezvous() }},
	}
	for _, r := range rules {
		for _, n := range benchSizes {
			bal := benchOneZone(b, r.new(), n)
			b.Run(fmt.Sprintf("%s/N=%d", r.name, n), func(b *testing.B) {
				runChoose(b, bal, ctxs)
			})
		}
	}
}

// BenchmarkSetServersRule is BenchmarkSetServers under the rules that
// index each snapshot: BestAvailable builds its tree and points every
// server's statistics at it, Maglev builds its table.
func BenchmarkSetServersRule(b *testing.B) {
	for _, rule := range []string{RuleZoneAvoidance, RuleBestAvailable, RuleMaglev} {
		for _, n := range []int{3, 100, 10000} {
			b.Run(fmt.Sprintf("%s/N=%d", rule, n), func(b *testing.B) {
				bal := benchBalancer(b, rule, n)
				lists := [2][]Server{}
				for k := range lists {
					lists[k] = make([]Server, n)
					for i := range lists[k] {
						lists[k][i] = Server{ID: fmt.Sprintf("i-%d", i), Host: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256), Port: 8080, Zone: string(rune('a' + i%3))}
					}
				}
				lists[1][0].Port = 9090
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if err := bal.SetServers(lists[i%2]); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}

// BenchmarkMaglevBuild measures the table's build alone.
func BenchmarkMaglevBuild(b *testing.B) {
	for _, n := range benchSizes {
		list := make([]*Server, n)
		for i := range list {
			list[i] = &Server{ID: fmt.Sprintf("i-%d", i)}
		}
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				buildMaglev(list)
			}
		})
	}
}
