package balancer

import (
	"context"
	"fmt"
	"testing"
	"time"
)

var benchSizes = []int{3, 100, 1000, 10000}

// benchBalancer spreads n servers over zones a, b, c with some response
// times recorded, using the real clock and randomness.
func benchBalancer(b *testing.B, rule string, n int, opts ...Option) *Balancer {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Rule = rule
	bal, err := New("bench", cfg, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bal.Close() })
	list := make([]Server, n)
	for i := range list {
		list[i] = Server{ID: fmt.Sprintf("i-%d", i), Host: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256), Port: 8080, Zone: string(rune('a' + i%3))}
	}
	if err := bal.SetServers(list); err != nil {
		b.Fatal(err)
	}
	for i, s := range bal.AllServers() {
		s.Stats().requestFinished(tenthsOfMs(i))
	}
	return bal
}

func tenthsOfMs(i int) time.Duration { return time.Duration(i%50+1) * 100 * time.Microsecond }

func BenchmarkChoose(b *testing.B) {
	rules := []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance, RuleAvailabilityFiltering,
		RuleWeightedResponseTime, RuleBestAvailable, RuleRetry, RuleRendezvous}
	for _, rule := range rules {
		for _, n := range benchSizes {
			bal := benchBalancer(b, rule, n)
			ctx := context.Background()
			if rule == RuleRendezvous {
				ctx = WithKey(ctx, "user-42")
			}
			b.Run(fmt.Sprintf("%s/N=%d/serial", rule, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bal.Choose(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(fmt.Sprintf("%s/N=%d/parallel", rule, n), func(b *testing.B) {
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

// BenchmarkSetServers measures a list change of a 10,000-server balancer:
// adopting the list (reusing unchanged servers), zone grouping and the
// snapshot swap. Each iteration alternates one server, so every call
// builds a new snapshot.
func BenchmarkSetServers(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			bal := benchBalancer(b, RuleZoneAvoidance, n)
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

// BenchmarkPick measures a pick that is reported, as the gRPC balancer
// makes one: Pick, then Done without a response time. It must not allocate
// for the simple rules. timed is a balancer that times its picks (the
// default: two system-clock readings a request), untimed a started one
// built WithoutPickTiming, which reads the coarse clock.
func BenchmarkPick(b *testing.B) {
	for _, rule := range []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance} {
		for _, n := range []int{3, 100} {
			benchPickDone(b, fmt.Sprintf("%s/N=%d/timed", rule, n), benchBalancer(b, rule, n))
			untimed := benchBalancer(b, rule, n, WithoutPickTiming())
			if err := untimed.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			benchPickDone(b, fmt.Sprintf("%s/N=%d/untimed", rule, n), untimed)
		}
	}
}

// benchPickDone runs Pick then Done over bal, serially and in parallel.
func benchPickDone(b *testing.B, name string, bal *Balancer) {
	ctx := context.Background()
	serialAndParallel(b, name, func() error {
		p, err := bal.Pick(ctx)
		p.Done(DoneInfo{})
		return err
	})
}

// BenchmarkChooseUnderLoad measures a request as lbhttp's Transport makes
// one, Choose then Begin and Done, on a started balancer (its coarse
// clock) over 3 zones with requests in flight on every server: the load
// changes with every request, so each Choose finds its zone decision's
// load changed since it was made. The balancer is built
// WithoutPickTiming, so that the figure is the choice and the statistics
// (the Transport's timed picks add two readings of the system clock).
func BenchmarkChooseUnderLoad(b *testing.B) {
	for _, rule := range []string{RuleRoundRobin, RuleZoneAvoidance} {
		for _, n := range []int{3, 100} {
			bal := benchBalancer(b, rule, n, WithoutPickTiming())
			if err := bal.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			for _, s := range bal.AllServers() {
				p := bal.Begin(s) // one request in flight on each server
				b.Cleanup(p.End)
			}
			ctx := context.Background()
			b.Run(fmt.Sprintf("%s/N=%d", rule, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					s, err := bal.Choose(ctx)
					if err != nil {
						b.Fatal(err)
					}
					bal.Begin(s).Done(DoneInfo{})
				}
			})
		}
	}
}
