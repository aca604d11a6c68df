package balancer

import (
	"math"
	"strings"
	"testing"
	"time"
)

// inZone counts the picks of counts that went to zone (IDs "<zone><i>").
func inZone(counts map[string]int, zone string) int {
	n := 0
	for id, c := range counts {
		if strings.HasPrefix(id, zone) {
			n += c
		}
	}
	return n
}

// A breaker whose blackout ended and that trips again (its failure count
// then above the threshold) is a trip like the first: the zone choice sees
// it at once, as Config.ZoneStatsInterval's doc promises, and BreakerTrips
// counts it. RoundRobin ignores breakers, so only the zone choice keeps
// picks out of zone a.
func TestBreakerRetripRefreshesZonesAtOnce(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, zoned(2, "a", "b", "c"))
	tb.trip(t, "a0", "a1") // 3 failures each: zone a blacked out for 10 s
	if n := inZone(tb.pickCounts(t, 600), "a"); n != 0 {
		t.Fatalf("zone a tripped: picked %d times", n)
	}

	tb.clock.Advance(tb.cfg.Breaker.Factor) // both blackouts over
	if n := inZone(tb.pickCounts(t, 600), "a"); n < 100 {
		t.Fatalf("zone a's blackouts over: picked %d times of 600, want about 200", n)
	}

	for _, id := range []string{"a0", "a1"} {
		tb.ServerStats(id).noteConnectionFailure() // the 4th: open again for 20 s
	}
	if n := inZone(tb.pickCounts(t, 600), "a"); n != 0 {
		t.Fatalf("zone a tripped again, clock unchanged: picked %d times, want 0 at once", n)
	}
	if n := tb.BreakerTrips(); n != 4 {
		t.Fatalf("BreakerTrips = %d, want 4", n)
	}
}

// Load reaches the zone choice within ZoneStatsInterval, whether the picks
// that follow are Choose (which reads no clock while nothing changed) or
// Pick, and whether or not another request starts or ends meanwhile.
func TestZoneChoiceFollowsLoadWithinInterval(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, zoned(2, "a", "b", "c"))
	var picks []Pick
	for _, id := range []string{"a0", "a0", "a1", "a1"} { // load 2 per server in zone a
		picks = append(picks, tb.Begin(tb.Server(id)))
	}
	tb.clock.Advance(tb.cfg.ZoneStatsInterval)
	if n := inZone(tb.pickCounts(t, 600), "a"); n != 0 {
		t.Fatalf("zone a overloaded: Choose picked it %d times", n)
	}

	for _, p := range picks {
		p.Done(DoneInfo{ResponseTime: time.Millisecond})
	}
	tb.clock.Advance(tb.cfg.ZoneStatsInterval)
	seen := 0
	for range 60 {
		p, err := tb.Pick(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if p.Server.Zone == "a" {
			seen++
		}
		p.Done(DoneInfo{})
	}
	if seen == 0 {
		t.Fatal("zone a idle again: Pick never chose it")
	}
}

// An open breaker closes with no event when its blackout ends; a Choose
// sees it then.
func TestZoneChoiceSeesBlackoutEnd(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, zoned(2, "a", "b"))
	tb.trip(t, "a0", "a1")
	ctx := WithZone(t.Context(), "a")
	if s, err := tb.Choose(ctx); err != nil || s.Zone == "a" {
		t.Fatalf("forced zone a, all tripped: got %v, %v; want a server outside a", s, err)
	}
	tb.clock.Advance(tb.cfg.Breaker.Factor)
	if s, err := tb.Choose(ctx); err != nil || s.Zone != "a" {
		t.Fatalf("forced zone a, blackouts over: got %v, %v", s, err)
	}
	if n := inZone(tb.pickCounts(t, 100), "a"); n < 20 {
		t.Fatalf("zone a back: picked %d times of 100", n)
	}
}

// With several worst zones, Ribbon drops one at random weighted by
// instance count, then draws a zone among the others weighted by instance
// count. The decision folds both into one draw of the same probabilities.
func TestZoneDrawOfSeveralWorstZones(t *testing.T) {
	// Zones a, b, c with 1, 2, 3 servers, one active request per server:
	// load 1 everywhere (>= 0.2), so all three are worst.
	list := append(append(zoned(1, "a"), zoned(2, "b")...), zoned(3, "c")...)
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, list)
	for _, s := range tb.AllServers() {
		tb.Begin(s)
	}
	tb.clock.Advance(tb.cfg.ZoneStatsInterval)
	tb.Choose(t.Context()) // remakes the decision

	d := tb.Snapshot().decision.Load()
	if len(d.draw) != 3 {
		t.Fatalf("draw over %d zones, want 3", len(d.draw))
	}
	n := map[string]float64{"a": 1, "b": 2, "c": 3}
	want := map[string]float64{}
	for dropped, nd := range n { // Ribbon's two steps, enumerated
		for z, nz := range n {
			if z != dropped {
				want[z] += nd / 6 * nz / (6 - nd)
			}
		}
	}
	total := float64(d.cum[len(d.cum)-1])
	prev := 0
	for i, g := range d.draw {
		got := float64(d.cum[i]-prev) / total
		prev = d.cum[i]
		if math.Abs(got-want[g.name]) > 1e-6 {
			t.Errorf("zone %s drawn with probability %.6f, want %.6f", g.name, got, want[g.name])
		}
	}
}

// ZoneAvoidance with every zone available is Ribbon's ZoneAvoidanceRule:
// round robin over every server its zone predicate keeps (all of them),
// not a zone drawn at random per pick: each run of 6 picks over 3 zones
// of 2 servers takes every server once. With a zone avoided (tripped),
// the others share the picks.
func TestZoneAvoidanceRoundRobinsAcrossAvailableZones(t *testing.T) {
	t.Parallel()
	tb := newTest(t, func(c *Config) { c.Filter = FilterNone }, zoned(2, "a", "b", "c")) // ZoneAvoidance
	for run := range 50 {
		counts := tb.pickCounts(t, 6)
		if len(counts) != 6 {
			t.Fatalf("run %d of 6 picks: %v, want every server once", run, counts)
		}
	}
	tb.trip(t, "a0", "a1")
	counts := tb.pickCounts(t, 600)
	if n := inZone(counts, "a"); n != 0 {
		t.Fatalf("zone a tripped: picked %d times", n)
	}
	withinShare(t, "zone b", inZone(counts, "b"), 600, 0.5, 0.1)
}
