package balancer

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// withoutContextChoices lets a test see choose's common case, which any
// WithZone or hint made earlier in the process turns off for good: it
// clears choicesCarried for the test and sets it back after. Sequential
// tests only (no t.Parallel test runs beside them).
func withoutContextChoices(t *testing.T) {
	was := choicesCarried.Load()
	choicesCarried.Store(false)
	t.Cleanup(func() { choicesCarried.Store(was) })
}

// picksFrom chooses n times from counter position k on and returns the IDs.
func (tb *testBalancer) picksFrom(t *testing.T, k uint64, n int) []string {
	t.Helper()
	tb.rrCounter.n.Store(k)
	out := make([]string, n)
	for i := range out {
		s, err := tb.Choose(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s.ID
	}
	return out
}

// pickedCounts is pickCounts through Pick, which reads the time (so a
// decision's due, not its clockCheck, decides), each request ended
// without an outcome.
func (tb *testBalancer) pickedCounts(t *testing.T, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for range n {
		p, err := tb.Pick(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		p.End()
		counts[p.Server.ID]++
	}
	return counts
}

// The common case of choose (the decision's servers, read from
// Balancer.decision) picks exactly what the whole path picks from the same
// counter position, for RoundRobin and ZoneAvoidance, one zone or three.
func TestFastPickAgreesWithFullPath(t *testing.T) {
	withoutContextChoices(t)
	for _, c := range []struct {
		rule  string
		zones []string
	}{
		{RuleRoundRobin, []string{"a"}},
		{RuleRoundRobin, []string{"a", "b", "c"}},
		{RuleZoneAvoidance, []string{"a", "b", "c"}},
	} {
		t.Run(fmt.Sprintf("%s/%d", c.rule, len(c.zones)), func(t *testing.T) {
			tb := newTest(t, func(cfg *Config) { cfg.Rule = c.rule }, zoned(3, c.zones...))
			if tb.decision.Load().rr == nil {
				t.Fatal("the decision offers no common case")
			}
			fast := tb.picksFrom(t, 1<<40, 30)
			choicesCarried.Store(true) // the whole path from here
			full := tb.picksFrom(t, 1<<40, 30)
			choicesCarried.Store(false)
			if !slices.Equal(fast, full) {
				t.Fatalf("common case %v\nwhole path  %v", fast, full)
			}
			seen := map[string]bool{}
			for _, id := range fast {
				seen[id] = true
			}
			if len(seen) != 3*len(c.zones) {
				t.Fatalf("30 picks reached %d servers, want %d", len(seen), 3*len(c.zones))
			}
		})
	}
}

// Whatever the common case cannot serve leaves it: a zone drawn per pick,
// unequal weights, a server at its breaker's threshold under
// ZoneAvoidance, an ejection. A list change is seen by the next pick.
func TestFastPickStepsAside(t *testing.T) {
	withoutContextChoices(t)

	t.Run("list change", func(t *testing.T) {
		tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, servers(3, "", 0))
		if err := tb.SetServers(servers(2, "", 10)); err != nil {
			t.Fatal(err)
		}
		if got := tb.decision.Load(); got != tb.snap.Load().decision.Load() {
			t.Fatal("Balancer.decision is not the new snapshot's")
		}
		for _, id := range tb.picksFrom(t, 7, 20) {
			if id != "s10" && id != "s11" {
				t.Fatalf("picked %s after the list changed to s10, s11", id)
			}
		}
	})

	t.Run("zone drawn", func(t *testing.T) {
		tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, zoned(2, "a", "b", "c"))
		tb.trip(t, "a0", "a1")
		if tb.decision.Load().rr != nil {
			t.Fatal("zone a avoided, yet the decision offers its servers to every pick")
		}
		if n := inZone(tb.pickCounts(t, 300), "a"); n != 0 {
			t.Fatalf("zone a tripped: picked %d times", n)
		}
	})

	t.Run("weights", func(t *testing.T) {
		list := servers(2, "", 0)
		list[0].Weight = 300
		tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, list)
		if tb.decision.Load().rr != nil {
			t.Fatal("unequal weights, yet the decision offers plain round robin")
		}
		if n := tb.pickCounts(t, 400)["s0"]; n != 300 {
			t.Fatalf("s0 of weight 300 beside 100: picked %d times of 400, want 300", n)
		}
	})

	t.Run("threshold under ZoneAvoidance", func(t *testing.T) {
		tb := newTest(t, func(c *Config) { c.Rule = RuleZoneAvoidance; c.ZoneAware = false }, servers(3, "", 0))
		if tb.decision.Load().rr == nil {
			t.Fatal("the decision offers no common case")
		}
		tb.trip(t, "s1")
		if n := tb.pickCounts(t, 300)["s1"]; n != 0 {
			t.Fatalf("s1 tripped: ZoneAvoidance chose it %d times", n)
		}
		if n := tb.pickedCounts(t, 300)["s1"]; n != 0 {
			t.Fatalf("s1 tripped: ZoneAvoidance picked it %d times", n)
		}
	})

	t.Run("ejection", func(t *testing.T) {
		tb := newTest(t, func(c *Config) {
			c.Rule = RuleRoundRobin
			c.OutlierDetection.Consecutive5xx = 1
		}, servers(3, "", 0))
		tb.Begin(tb.Server("s2")).Done(DoneInfo{ServerError: true})
		if !tb.ServerStats("s2").Ejected() {
			t.Fatal("s2 not ejected")
		}
		if n := tb.pickCounts(t, 300)["s2"]; n != 0 {
			t.Fatalf("s2 ejected: chosen %d times", n)
		}
		if n := tb.pickedCounts(t, 300)["s2"]; n != 0 {
			t.Fatalf("s2 ejected: picked %d times", n)
		}
	})
}

// Balancer.decision ends as the current snapshot's decision whatever the
// order in which list changes and zone decisions raced (syncDecision).
func TestDecisionSyncUnderRaces(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, zoned(2, "a", "b", "c"))
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := range 300 {
			if err := tb.SetServers(zoned(1+i%3, "a", "b", "c")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range 300 {
			tb.refreshZones()
		}
	}()
	go func() {
		defer wg.Done()
		for range 3000 {
			if _, err := tb.Choose(t.Context()); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	if tb.decision.Load() != tb.snap.Load().decision.Load() {
		t.Fatal("Balancer.decision is not the current snapshot's once the writers stopped")
	}
}

// TestFastChooseUnderLoadWaitsForDue: on a started balancer (the system
// clock, its coarse clock), a Choose whose decision's load changed keeps
// the decision until it is due, then remakes it: zone a, loaded well past
// the triggering load, is avoided once ZoneStatsInterval has passed,
// though nothing but Choose runs after the load was taken.
func TestFastChooseUnderLoadWaitsForDue(t *testing.T) {
	withoutContextChoices(t)
	cfg := DefaultConfig()
	cfg.Rule = RuleRoundRobin
	cfg.ZoneStatsInterval = 20 * time.Millisecond
	b, err := New("due", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.SetServers(zoned(2, "a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	if b.decision.Load().rr == nil {
		t.Fatal("no load: the decision offers no common case")
	}
	for _, id := range []string{"a0", "a1"} {
		for range 10 {
			p := b.Begin(b.Server(id)) // held: 10 requests in flight on each
			t.Cleanup(p.End)
		}
	}
	testutil.Eventually(t, "Choose to remake the due decision and avoid the loaded zone a", func() bool {
		for range 30 {
			s, err := b.Choose(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if s.Zone == "a" {
				return false
			}
		}
		return true
	})
}

// TestLoadChangeMarksTheDecisionMadeMeanwhile: an active count that
// changes while the zone decision is remade marks the decision being
// replaced (markLoadChanged loads the current one first), and the new one
// must carry the mark too, or a Choose would keep it past its due without
// reading the clock. One goroutine starts and ends requests without a
// pause while the test remakes the decision; once both are done, the
// current decision carries the mark whenever zonesPending is set.
func TestLoadChangeMarksTheDecisionMadeMeanwhile(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Rule = RuleRoundRobin
	cfg.ZoneStatsInterval = time.Hour // never due: only the test remakes it
	b, err := New("meanwhile", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.SetServers(zoned(250, "a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	srv := b.Server("a0")
	long, short := zoned(250, "a", "b", "c"), zoned(249, "a", "b", "c")
	remakes := map[string]func(round int){
		// The refresher's remake when due, or a breaker's.
		"publishZones": func(int) { b.publishZones(b.snap.Load()) },
		// A list change: the new snapshot's decision (swapLocked).
		"SetServers": func(round int) {
			if err := b.SetServers([][]Server{long, short}[round%2]); err != nil {
				t.Error(err)
			}
		},
	}
	for _, how := range []string{"publishZones", "SetServers"} {
		testLoadChangeMarks(t, b, srv, how, remakes[how])
	}
}

func testLoadChangeMarks(t *testing.T, b *Balancer, srv *Server, how string, remake func(round int)) {
	for round := range 200 {
		stop := make(chan struct{})
		var requests atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					b.Begin(srv).End()
					requests.Add(1)
				}
			}
		})
		for requests.Load() == 0 {
			runtime.Gosched()
		}
		remake(round) // clears zonesPending, decides over 750 servers, installs
		// A request that began after the decision was installed: load
		// changed since, whatever came during the remake.
		for after := requests.Load(); requests.Load() < after+2; {
			runtime.Gosched()
		}
		close(stop)
		wg.Wait()
		if !b.shared.zonesPending.Load() {
			t.Fatalf("%s, round %d: requests ran since the decision was made and nothing is pending", how, round)
		}
		if b.decision.Load().recheck.Load()&recheckLoad == 0 {
			t.Fatalf("%s, round %d: load changed since the decision was made (zonesPending), and the decision is not marked: a Choose would not read the clock", how, round)
		}
	}
}
