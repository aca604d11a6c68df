package balancer

import (
	"context"
	"fmt"
	"math/bits"
	"testing"
	"time"
)

// BenchmarkSlowStart compares, in one run at N = 10,000, picks with slow
// start off, on with no server ramping (must cost the same: no ramp, no
// table), and on with one server ramping (every view's weights differ:
// the weighted paths, and a Choose reads the coarse clock to see whether
// the live weights are due). The balancers are started, as in a gateway,
// so they read the coarse clock; the window (10 min) refreshes every
// 30 s, never during a run.
func BenchmarkSlowStart(b *testing.B) {
	const n = 10000
	for _, rule := range []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance, RuleLeastRequest, RuleBestAvailable} {
		for _, mode := range []string{"off", "steady", "ramping"} {
			// The three built the same way: only the window differs.
			window := 10 * time.Minute
			if mode == "off" {
				window = 0
			}
			bal := slowStartBalancer(b, rule, n, window, mode == "ramping")
			if got := len(bal.Ramping()); got != map[string]int{"off": 0, "steady": 0, "ramping": 1}[mode] {
				b.Fatalf("%s: %d servers ramping", mode, got)
			}
			if err := bal.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			serialAndParallel(b, fmt.Sprintf("%s/N=%d/%s", rule, n, mode), func() error {
				_, err := bal.Choose(ctx)
				return err
			})
		}
	}
}

// BenchmarkSlowStartRefresh is the cost of one refresh of the live weights
// (a snapshot rebuilt with its weight tables and zone decision) at
// N = 100 and 10,000 with one server ramping, paid by one pick every
// max(window / 20, 1 s).
func BenchmarkSlowStartRefresh(b *testing.B) {
	for _, n := range []int{100, 10000} {
		for _, rule := range []string{RuleRoundRobin, RuleZoneAvoidance, RuleBestAvailable} {
			benchRefresh(b, rule, n)
		}
	}
}

// BenchmarkSlowStartRampPicks is the latency of every pick at N = 10,000
// while a server ramps, with the live weights due every 20,000 picks (a
// fake clock moved by 1/20,000 of the refresh period before each pick), in
// one run: "inline" refreshes them on the pick that finds them due, as a
// pick did before the refresher (the same refreshRamps, called where
// rampDue called it), "refresher" leaves them to the refresher, which that
// pick wakes. It reports the worst pick (max-ns), the 99.99th and 99.9th
// percentiles (a histogram of 16 buckets per power of two, 6 % wide), the
// mean of the picks that found the weights due (due-ns: the refreshing
// picks when inline), each pick timed with two system-clock readings, and
// the refreshes per million picks. The zone statistics and the active
// counts are made not to expire (with the fake clock 9 ms a pick, a pick
// would remake the zone decision every 11 picks, zone.go, and resync
// BestAvailable's tree every 4,167, leastactive.go: O(N) each, on the
// request path too), so that only the ramp differs; a ramp that ends is
// started again between two picks, outside their timings.
func BenchmarkSlowStartRampPicks(b *testing.B) {
	const n, picksPerRefresh = 10000, 20000
	for _, rule := range []string{RuleRoundRobin, RuleZoneAvoidance, RuleBestAvailable} {
		for _, mode := range []string{"inline", "refresher"} {
			b.Run(fmt.Sprintf("%s/N=%d/%s", rule, n, mode), func(b *testing.B) {
				cfg := DefaultConfig()
				cfg.Rule = rule
				cfg.SlowStart.Window = time.Hour
				cfg.ZoneStatsInterval = 1000 * time.Hour
				cfg.ActiveRequestsTimeout = 1000 * time.Hour
				clock := newFakeClock()
				bal, err := New("bench", cfg, WithClock(clock))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { bal.Close() })
				list := benchList(n)
				ramps := 0
				ramp := func() {
					if err := bal.SetServers(list[1:]); err != nil {
						b.Fatal(err)
					}
					if err := bal.SetServers(list); err != nil {
						b.Fatal(err)
					}
					ramps++
				}
				ramp()
				from := bal.Snapshot().Version()
				step := cfg.SlowStart.refreshPeriod() / picksPerRefresh
				ctx := context.Background()
				var all, due latencies
				for b.Loop() {
					clock.Advance(step)
					snap := bal.Snapshot()
					if snap.ramp == nil {
						ramp()
						snap = bal.Snapshot()
					}
					isDue := bal.shared.nanotime() >= snap.ramp.due
					start := time.Now()
					if mode == "inline" && isDue && snap.ramp.claimed.CompareAndSwap(false, true) {
						bal.refreshRamps(snap)
					}
					if _, err := bal.Choose(ctx); err != nil {
						b.Fatal(err)
					}
					d := int64(time.Since(start))
					all.add(d)
					if isDue {
						due.add(d)
					}
				}
				refreshes := bal.Snapshot().Version() - from - 2*uint64(ramps-1)
				b.ReportMetric(float64(all.max), "max-ns")
				b.ReportMetric(float64(all.quantile(0.9999)), "p99.99-ns")
				b.ReportMetric(float64(all.quantile(0.999)), "p99.9-ns")
				b.ReportMetric(float64(due.sum)/float64(max(due.n, 1)), "due-ns")
				b.ReportMetric(float64(refreshes)*1e6/float64(all.n), "refreshes/Mpick")
			})
		}
	}
}

// latencies is a histogram of nanosecond latencies: exact below 16 ns,
// then 16 buckets per power of two.
type latencies struct {
	counts   [64 * 16]uint64
	n        uint64
	sum, max int64
}

func latencyBucket(ns int64) int {
	if ns < 16 {
		return int(max(ns, 0))
	}
	e := bits.Len64(uint64(ns)) - 5
	return (e+1)*16 + int(ns>>e)&15
}

func (l *latencies) add(ns int64) {
	l.counts[latencyBucket(ns)]++
	l.n++
	l.sum += ns
	l.max = max(l.max, ns)
}

// quantile returns the least latency of the bucket that holds quantile q.
func (l *latencies) quantile(q float64) int64 {
	rank := uint64(q * float64(l.n))
	seen := uint64(0)
	for i, c := range l.counts {
		if seen += c; seen > rank {
			if i < 16 {
				return int64(i)
			}
			e := i/16 - 1
			return int64(16+i%16) << e
		}
	}
	return l.max
}

// slowStartBalancer builds a balancer of rule over n servers with a
// slow-start window (0: off); with ramping, the last list adds one server
// to a first one, so that it ramps.
func slowStartBalancer(b *testing.B, rule string, n int, window time.Duration, ramping bool) *Balancer {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Rule = rule
	cfg.SlowStart.Window = window
	bal, err := New("bench", cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bal.Close() })
	list := benchList(n)
	if ramping {
		if err := bal.SetServers(list[1:]); err != nil {
			b.Fatal(err)
		}
	}
	if err := bal.SetServers(list); err != nil {
		b.Fatal(err)
	}
	return bal
}

func benchRefresh(b *testing.B, rule string, n int) {
	bal := slowStartBalancer(b, rule, n, 10*time.Minute, true)
	b.Run(fmt.Sprintf("%s/N=%d", rule, n), func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			bal.refreshRamps(bal.Snapshot())
		}
		if len(bal.Ramping()) != 1 {
			b.Fatal("not ramping")
		}
	})
}

// benchList is benchBalancer's list of n servers in three zones.
func benchList(n int) []Server {
	list := make([]Server, n)
	for i := range list {
		list[i] = Server{ID: fmt.Sprintf("i-%d", i), Host: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256), Port: 8080, Zone: string(rune('a' + i%3))}
	}
	return list
}
