package balancer

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkWeighted compares, in one run, picks over N = 10,000 servers of
// equal weights (the unweighted paths) and of mixed weights (1 to 1,000,
// spread with a fixed pattern), for the rules weights change. Goal: the
// mixed pick costs at most 1.5x the equal one.
func BenchmarkWeighted(b *testing.B) {
	const n = 10000
	for _, rule := range []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance, RuleLeastRequest, RuleBestAvailable} {
		for _, mixed := range []bool{false, true} {
			bal := benchBalancer(b, rule, n)
			if mixed {
				list := make([]Server, n)
				for i, s := range bal.AllServers() {
					list[i] = *s
					list[i].Weight = 1 + i*7919%MaxWeight
				}
				if err := bal.SetServers(list); err != nil {
					b.Fatal(err)
				}
				if bal.snap.Load().full.wt == nil {
					b.Fatal("no weight table")
				}
			}
			name := "equal"
			if mixed {
				name = "mixed"
			}
			ctx := context.Background()
			b.Run(fmt.Sprintf("%s/N=%d/%s", rule, n, name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bal.Choose(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/N=%d/%s/parallel", rule, n, name), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := bal.Choose(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
