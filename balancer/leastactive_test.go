package balancer

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

// oneZone builds a balancer of rule over n servers of one zone, without
// zone narrowing, with the fake clock and a seeded randomness.
func oneZone(t testing.TB, rule string, n int, opts ...Option) *testBalancer {
	t.Helper()
	return newTest(t, func(c *Config) {
		c.Rule = rule
		c.Filter = FilterNone
		c.ZoneAware = false
	}, servers(n, "", 0), opts...)
}

// load starts n requests on each of the servers with these IDs.
func (tb *testBalancer) load(t testing.TB, n int, ids ...string) {
	t.Helper()
	for _, id := range ids {
		st := tb.ServerStats(id)
		if st == nil {
			t.Fatalf("no server %q", id)
		}
		for range n {
			st.requestStarted()
		}
	}
}

// checkUniform fails unless every ID of want got within tol (a fraction) of
// its share of total picks, and nothing else was picked.
func checkUniform(t *testing.T, counts map[string]int, want []string, total int, tol float64) {
	t.Helper()
	share := float64(total) / float64(len(want))
	seen := 0
	for _, id := range want {
		c := counts[id]
		seen += c
		if math.Abs(float64(c)-share) > tol*share {
			t.Errorf("%s picked %d times, want %.0f ± %.0f%%: %v", id, c, share, tol*100, counts)
		}
	}
	if seen != total {
		t.Errorf("picked outside %v: %v", want, counts)
	}
}

func idRange(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("s%d", i))
	}
	return out
}

// checkTree verifies, with no update running, that every leaf of every tree
// of the current snapshot matches its server's statistics and every node
// its children: the tree converged.
func checkTree(t *testing.T, tb *testBalancer) {
	t.Helper()
	snap := tb.Snapshot()
	views := []*View{&snap.full}
	for _, g := range snap.zones {
		views = append(views, &g.view)
	}
	now := tb.shared.nanotime()
	for _, v := range views {
		tr := v.least.Load()
		if tr == nil {
			continue
		}
		for i, s := range tr.servers {
			want, _ := leafWord(s.inst.view(), now, true)
			if got := tr.levels[0][i].Load(); got != want {
				t.Errorf("leaf %s = %x, want %x", s.ID, got, want)
			}
		}
		for lv := 1; lv < len(tr.levels); lv++ {
			for i := range len(tr.levels[lv-1]) / fan {
				if got, want := tr.levels[lv][i].Load(), combine(tr.levels[lv-1][i*fan:i*fan+fan]); got != want {
					t.Errorf("level %d node %d = %x, want %x", lv, i, got, want)
				}
			}
		}
	}
}

// Ribbon's BestAvailableRule sends every pick of an idle list to its first
// server; pushlb draws among the least loaded.
func TestBestAvailableIdleIsUniform(t *testing.T) {
	for _, n := range []int{3, 10, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			tb := oneZone(t, RuleBestAvailable, n)
			total := 500 * n
			checkUniform(t, tb.pickCounts(t, total), idRange(0, n), total, 0.2)
		})
	}
}

func TestBestAvailableAvoidsLoaded(t *testing.T) {
	tb := oneZone(t, RuleBestAvailable, 10)
	tb.load(t, 2, idRange(0, 5)...)
	tb.load(t, 1, "s7")
	// Only the idle servers, evenly.
	checkUniform(t, tb.pickCounts(t, 4000), []string{"s5", "s6", "s8", "s9"}, 4000, 0.15)
	// Then the least loaded of the rest.
	tb.load(t, 1, "s5", "s6", "s8", "s9")
	checkUniform(t, tb.pickCounts(t, 5000), []string{"s5", "s6", "s7", "s8", "s9"}, 5000, 0.15)
	checkTree(t, tb)
}

// Picks that stay active spread exactly: k rounds of n picks leave every
// server with k requests.
func TestBestAvailableIsExact(t *testing.T) {
	const n = 37
	tb := oneZone(t, RuleBestAvailable, n)
	var picks []Pick
	for round := 1; round <= 4; round++ {
		for range n {
			p, err := tb.Pick(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			picks = append(picks, p)
		}
		for _, s := range tb.AllServers() {
			if a := s.Stats().ActiveRequests(); a != int64(round) {
				t.Fatalf("round %d: %s has %d active", round, s.ID, a)
			}
		}
	}
	// Ending requests of one server makes it the least loaded.
	for _, p := range picks {
		if p.Server.ID == "s11" {
			p.Done(DoneInfo{})
		}
	}
	for range 20 {
		if s, _ := tb.Choose(t.Context()); s.ID != "s11" {
			t.Fatalf("after s11's requests ended got %s", s.ID)
		}
	}
	checkTree(t, tb)
}

func TestBestAvailableSkipsTripped(t *testing.T) {
	tb := oneZone(t, RuleBestAvailable, 10)
	tb.load(t, 5, "s9")
	tb.trip(t, idRange(0, 9)...)
	for range 100 {
		if s, _ := tb.Choose(t.Context()); s.ID != "s9" {
			t.Fatalf("got %s, want s9, the one closed breaker, loaded as it is", s.ID)
		}
	}
	// Every breaker open: round robin over all, as Ribbon falls back.
	tb.trip(t, "s9")
	checkUniform(t, tb.pickCounts(t, 1000), idRange(0, 10), 1000, 0.01)

	// A breaker closes when its blackout ends, without an event: the pick
	// after that time sees it.
	tb.clock.Advance(tb.cfg.Breaker.Factor + time.Millisecond)
	checkUniform(t, tb.pickCounts(t, 3000), idRange(0, 9), 3000, 0.2)
	// A response closes it at once.
	tb.trip(t, "s3")
	tb.ServerStats("s3").responseReceived(time.Millisecond)
	tb.trip(t, idRange(0, 3)...)
	checkUniform(t, tb.pickCounts(t, 3000), idRange(3, 9), 3000, 0.2)
	checkTree(t, tb)
}

func TestBestAvailableActiveCountsDecay(t *testing.T) {
	tb := oneZone(t, RuleBestAvailable, 3)
	tb.load(t, 5, "s0") // never ended
	tb.clock.Advance(tb.cfg.ActiveRequestsTimeout + tb.cfg.ActiveRequestsTimeout/activeResyncDivisor)
	tb.load(t, 1, "s1", "s2") // fresh load
	for range 20 {
		if s, _ := tb.Choose(t.Context()); s.ID != "s0" {
			t.Fatalf("got %s; s0's leaked count should have decayed to 0", s.ID)
		}
	}
	checkTree(t, tb)
}

// Stats survive list changes; the new snapshot's tree starts from them.
func TestBestAvailableAcrossListChanges(t *testing.T) {
	tb := oneZone(t, RuleBestAvailable, 4)
	tb.load(t, 3, "s0", "s1", "s2")
	if err := tb.SetServers(servers(6, "", 0)); err != nil {
		t.Fatal(err)
	}
	checkUniform(t, tb.pickCounts(t, 3000), []string{"s3", "s4", "s5"}, 3000, 0.15)
	tb.MarkServerDown("s4")
	tb.load(t, 1, "s3") // a change after the swap reaches the new tree
	for range 50 {
		if s, _ := tb.Choose(t.Context()); s.ID != "s5" {
			t.Fatalf("got %s, want s5", s.ID)
		}
	}
	checkTree(t, tb)
}

// A zone's view (WithZone) gets a tree of its own, built by its first pick.
func TestBestAvailableInAZone(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleBestAvailable }, zoned(4, "a", "b"))
	tb.load(t, 1, "b0", "b1", "a2", "a3")
	ctx := WithZone(t.Context(), "b")
	counts := map[string]int{}
	for range 2000 {
		s, err := tb.Choose(ctx)
		if err != nil {
			t.Fatal(err)
		}
		counts[s.ID]++
	}
	checkUniform(t, counts, []string{"b2", "b3"}, 2000, 0.15)
	// Both trees follow a change.
	tb.load(t, 2, "b2", "b3")
	tb.load(t, 5, "a0", "a1")
	for range 50 {
		if s, _ := tb.Choose(ctx); s.ID != "b0" && s.ID != "b1" {
			t.Fatalf("zone b: got %s", s.ID)
		}
		if s, _ := tb.Choose(t.Context()); s.ID != "a2" && s.ID != "a3" && s.ID != "b0" && s.ID != "b1" {
			t.Fatalf("all: got %s", s.ID)
		}
	}
	checkTree(t, tb)
}

// Picks, reports and list changes from many goroutines leave every tree
// exact once they stop.
func TestBestAvailableConcurrentConverges(t *testing.T) {
	tb := newTest(t, func(c *Config) {
		c.Rule = RuleBestAvailable
		c.Filter = FilterNone
		c.ZoneAware = false // the full view unless a zone is forced
	}, zoned(30, "a", "b", "c"))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := t.Context()
			if g%2 == 0 {
				ctx = WithZone(ctx, string(rune('a'+g%3)))
			}
			var held []Pick
			for i := range 2000 {
				p, err := tb.Pick(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				switch i % 4 {
				case 0:
					held = append(held, p)
				case 1:
					p.Done(DoneInfo{Err: fmt.Errorf("refused"), ConnectFailure: g == 0})
				default:
					p.Done(DoneInfo{})
				}
			}
			for _, p := range held[:len(held)/2] {
				p.End()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			tb.SetServers(zoned(30-i%2, "a", "b", "c"))
		}
	}()
	wg.Wait()
	checkTree(t, tb)
	// And still exact: the least loaded server is picked.
	snap := tb.Snapshot()
	now := tb.shared.nanotime()
	least := int64(math.MaxInt64)
	for _, s := range snap.full.servers {
		if !s.inst.view().trippedAt(now) {
			least = min(least, s.inst.view().activeAt(now))
		}
	}
	for range 100 {
		s, _ := tb.Choose(t.Context())
		if a := s.Stats().ActiveRequests(); a != least {
			t.Fatalf("picked %s with %d active, the least is %d", s.ID, a, least)
		}
	}
}

// A PickInfo made by hand (a rule composed in tests or another rule) has
// no tree: the rule scans.
func TestBestAvailableHandMadePickInfo(t *testing.T) {
	tb := oneZone(t, RuleBestAvailable, 5)
	tb.load(t, 1, "s0", "s1", "s3", "s4")
	v := tb.Snapshot().Full()
	s, err := NewBestAvailable().Choose(PickInfo{Ctx: t.Context(), View: v, Candidates: v})
	if err != nil || s.ID != "s2" {
		t.Fatalf("got %v, %v; want s2", s, err)
	}
}

func TestLeastRequestIdleIsUniform(t *testing.T) {
	tb := oneZone(t, RuleLeastRequest, 10)
	checkUniform(t, tb.pickCounts(t, 10000), idRange(0, 10), 10000, 0.1)
}

// Power of two choices: a server is picked when it is the less loaded of
// the two drawn, so the most loaded is picked only when drawn twice
// (1/N^2 of the picks) and load shifts strongly to the least loaded.
func TestLeastRequestAvoidsLoaded(t *testing.T) {
	const n, picks = 10, 20000
	tb := oneZone(t, RuleLeastRequest, n)
	for i := range n {
		tb.load(t, i, fmt.Sprintf("s%d", i)) // s0 idle ... s9 with 9
	}
	c := tb.pickCounts(t, picks)
	// s_i is picked with probability ((n-i)^2 - (n-i-1)^2) / n^2.
	for i := range n {
		want := float64(2*(n-i)-1) / float64(n*n) * picks
		if got := float64(c[fmt.Sprintf("s%d", i)]); math.Abs(got-want) > 0.15*want+30 {
			t.Errorf("s%d picked %.0f times, want %.0f: %v", i, got, want, c)
		}
	}
}

func TestLeastRequestSkipsTripped(t *testing.T) {
	tb := oneZone(t, RuleLeastRequest, 10)
	tb.trip(t, idRange(0, 5)...)
	checkUniform(t, tb.pickCounts(t, 5000), idRange(5, 10), 5000, 0.15)
	tb.trip(t, idRange(5, 9)...)
	for range 100 {
		if s, _ := tb.Choose(t.Context()); s.ID != "s9" {
			t.Fatalf("got %s, want s9, the one closed breaker", s.ID)
		}
	}
	tb.trip(t, "s9")
	checkUniform(t, tb.pickCounts(t, 1000), idRange(0, 10), 1000, 0.01)
}

// The pick path of the least-loaded and keyed rules allocates nothing,
// once each server has had the connection failure that allocates its
// breaker counters (once in its life: TestBreakerCountersLazy).
func TestLeastAndKeyedPicksDoNotAllocate(t *testing.T) {
	for _, rule := range []string{RuleBestAvailable, RuleLeastRequest, RuleMaglev} {
		tb := newTest(t, func(c *Config) { c.Rule = rule }, zoned(30, "a", "b", "c"))
		ctx := WithKey(t.Context(), "user-42")
		zctx := WithZone(ctx, "b")
		for _, s := range tb.AllServers() {
			tb.Begin(s).Done(DoneInfo{ConnectFailure: true})
			tb.Begin(s).Done(DoneInfo{ResponseTime: time.Millisecond})
		}
		tb.trip(t, "a1")
		if n := testing.AllocsPerRun(200, func() {
			for _, c := range []context.Context{ctx, zctx} {
				p, err := tb.Pick(c)
				if err != nil {
					t.Fatal(err)
				}
				p.Responded(time.Millisecond)
				p.End()
				p, _ = tb.Pick(c)
				p.Done(DoneInfo{ConnectFailure: true})
			}
		}); n != 0 {
			t.Errorf("%s: Pick and its report allocate %v times", rule, n)
		}
	}
}
