package balancer

import (
	"context"
	"fmt"
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
