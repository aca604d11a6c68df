package balancer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// The benchmarks below split BenchmarkChoose's cost (servers over three
// zones, default config) into its parts, so that the
// rule's cost and the zone step's can be read apart (docs/perf/picks.md,
// "The zone decision is made off the pick path"):
//
//   - BenchmarkChooseRuleOnly: the rule alone, its Choose called over the
//     full view (no balancer, no zone step);
//   - BenchmarkChooseOneZone: Balancer.Choose over servers of one zone,
//     default config: the balancer's pick path without zone narrowing;
//   - BenchmarkChooseZoneStep: the zone step alone over three zones.

// zoneBenchSizes are the list sizes of these benchmarks.
var zoneBenchSizes = []int{3, 10000}

// zoneBenchRules are every rule by name; the keyed ones get a key.
var zoneBenchRules = []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance, RuleAvailabilityFiltering,
	RuleWeightedResponseTime, RuleRetry, RuleBestAvailable, RuleLeastRequest, RuleMaglev}

func zoneBenchCtx(rule string) context.Context {
	if rule == RuleMaglev || rule == RuleRendezvous {
		return WithKey(context.Background(), "user-42")
	}
	return context.Background()
}

// benchInZones builds a balancer of rule over n servers spread over the
// given zones (one zone: all in "a"), default config but for mutate, with
// response times recorded as benchBalancer does.
func benchInZones(b *testing.B, rule string, n, zones int, mutate func(*Config)) *Balancer {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Rule = rule
	if mutate != nil {
		mutate(&cfg)
	}
	bal, err := New("bench", cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bal.Close() })
	list := make([]Server, n)
	for i := range list {
		list[i] = Server{ID: fmt.Sprintf("i-%d", i), Host: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256), Port: 8080, Zone: string(rune('a' + i%zones))}
	}
	if err := bal.SetServers(list); err != nil {
		b.Fatal(err)
	}
	for i, s := range bal.AllServers() {
		s.Stats().requestFinished(tenthsOfMs(i))
	}
	return bal
}

// serialAndParallel runs f serially and from GOMAXPROCS goroutines.
func serialAndParallel(b *testing.B, name string, f func() error) {
	b.Run(name+"/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(name+"/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := f(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkChooseRuleOnly(b *testing.B) {
	for _, rule := range zoneBenchRules {
		for _, n := range zoneBenchSizes {
			bal := benchInZones(b, rule, n, 3, nil)
			full := bal.Snapshot().Full()
			ctx := zoneBenchCtx(rule)
			serialAndParallel(b, fmt.Sprintf("%s/N=%d", rule, n), func() error {
				_, err := bal.rule.Choose(PickInfo{Ctx: ctx, View: full, Candidates: full, b: bal})
				return err
			})
		}
	}
}

func BenchmarkChooseOneZone(b *testing.B) {
	for _, rule := range zoneBenchRules {
		for _, n := range zoneBenchSizes {
			bal := benchInZones(b, rule, n, 1, nil)
			ctx := zoneBenchCtx(rule)
			serialAndParallel(b, fmt.Sprintf("%s/N=%d", rule, n), func() error {
				_, err := bal.Choose(ctx)
				return err
			})
		}
	}
}

func BenchmarkChooseZoneStep(b *testing.B) {
	cases := []struct {
		name   string
		rule   string
		mutate func(*Config)
		ctx    context.Context
	}{
		{"ZoneAware", RuleRoundRobin, nil, context.Background()},
		{"ZoneAvoidance", RuleZoneAvoidance, nil, context.Background()},
		{"ZoneAffinity", RuleRoundRobin, func(c *Config) {
			c.Filter, c.Zone, c.ZoneAffinity.Enabled, c.ZoneAware = FilterZoneAffinity, "a", true, false
		}, context.Background()},
		{"WithZone", RuleRoundRobin, nil, WithZone(context.Background(), "b")},
	}
	for _, tc := range cases {
		for _, n := range zoneBenchSizes {
			bal := benchInZones(b, tc.rule, n, 3, tc.mutate)
			serialAndParallel(b, fmt.Sprintf("%s/N=%d", tc.name, n), func() error {
				if v, _, _, _ := bal.chooseZone(tc.ctx, bal.snap.Load(), 0, false); v.Len() == 0 {
					return ErrNoServers
				}
				return nil
			})
		}
	}
}

// BenchmarkRoundRobinFloor is the floor the picks are held against, in the
// same run: grpc-go's round_robin picker's own work (a slice and an atomic
// counter, its remainder taken by a 32-bit division), over n servers, next
// to Balancer.Choose with RoundRobin over one zone and three.
func BenchmarkRoundRobinFloor(b *testing.B) {
	for _, n := range zoneBenchSizes {
		list := make([]*Server, n)
		for i := range list {
			list[i] = &Server{ID: fmt.Sprint(i)}
		}
		var next atomic.Uint32
		serialAndParallel(b, fmt.Sprintf("floor/N=%d", n), func() error {
			if list[next.Add(1)%uint32(len(list))] == nil {
				return ErrNoServers
			}
			return nil
		})
		for _, zones := range []int{1, 3} {
			bal := benchInZones(b, RuleRoundRobin, n, zones, nil)
			ctx := context.Background()
			serialAndParallel(b, fmt.Sprintf("RoundRobin_%dzones/N=%d", zones, n), func() error {
				_, err := bal.Choose(ctx)
				return err
			})
		}
		bal := benchInZones(b, RuleZoneAvoidance, n, 3, nil)
		ctx := context.Background()
		serialAndParallel(b, fmt.Sprintf("ZoneAvoidance_3zones/N=%d", n), func() error {
			_, err := bal.Choose(ctx)
			return err
		})
	}
}
