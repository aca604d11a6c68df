package balancer

import (
	"math"
	"slices"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// weighted returns servers s0.. in zone with the given weights.
func weighted(zone string, from int, weights ...int) []Server {
	out := servers(len(weights), zone, from)
	for i, w := range weights {
		out[i].Weight = w
	}
	return out
}

// withinShare fails unless got/total is want within tol (fractions).
func withinShare(t *testing.T, what string, got, total int, want, tol float64) {
	t.Helper()
	if share := float64(got) / float64(total); math.Abs(share-want) > tol {
		t.Errorf("%s: share %.4f (%d of %d), want %.4f +- %.4f", what, share, got, total, want, tol)
	}
}

// Round robin over weights 100 and 300 is exactly 1:3 over every 4
// consecutive picks, and interleaved: the heavy server never gets more than
// its weight's worth in a row.
func TestWeightedRoundRobinExact(t *testing.T) {
	t.Parallel()
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin; c.Filter = FilterNone }, weighted("", 0, 100, 300))
	var seq []string
	for range 4000 {
		s, err := tb.Choose(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		seq = append(seq, s.ID)
	}
	for i := 0; i+4 <= len(seq); i += 4 {
		if n := countOf(seq[i:i+4], "s0"); n != 1 {
			t.Fatalf("picks %d-%d: %v, want s0 exactly once", i, i+3, seq[i:i+4])
		}
	}
	// Mixed weights with the default (0) among them: 1,200 picks give
	// each server its weight, give or take the slots it holds
	// (TestWeightedRoundRobinBound).
	ws := []int{100, 200, 0, 300, 500}
	tb = newTest(t, func(c *Config) { c.Rule = RuleRoundRobin; c.Filter = FilterNone }, weighted("", 0, ws...))
	counts := tb.pickCounts(t, 1200)
	for i, w := range ws {
		w = max(w, DefaultWeight)
		if got := counts[servers(5, "", 0)[i].ID]; got < w-3 || got > w+3 {
			t.Errorf("server %d (weight %d): %d picks of 1200, want %d +- 3", i, w, got, w)
		}
	}
}

func countOf(seq []string, id string) int {
	n := 0
	for _, s := range seq {
		if s == id {
			n++
		}
	}
	return n
}

// The order of a weighted cycle spreads a heavy server's picks: with
// weights 1,000 and 1 x 10, the light servers are not all bunched at one
// end of the cycle.
func TestWeightedRoundRobinInterleaves(t *testing.T) {
	t.Parallel()
	ws := []int{1000, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin; c.Filter = FilterNone }, weighted("", 0, ws...))
	var lightAt []int
	for i := range 1010 {
		s, _ := tb.Choose(t.Context())
		if s.ID != "s0" {
			lightAt = append(lightAt, i)
		}
	}
	if len(lightAt) < 9 || len(lightAt) > 11 {
		t.Fatalf("light picks at %v, want 10 +- 1 in 1,010", lightAt)
	}
	gaps := 0
	for i := 1; i < len(lightAt); i++ {
		if lightAt[i]-lightAt[i-1] > 20 {
			gaps++
		}
	}
	if gaps < 5 {
		t.Fatalf("light picks at %v: bunched", lightAt)
	}
}

// Random over weights 100 and 300 is 1:3 statistically (seeded).
func TestWeightedRandom(t *testing.T) {
	t.Parallel()
	tb := newTest(t, func(c *Config) { c.Rule = RuleRandom; c.Filter = FilterNone }, weighted("", 0, 100, 300))
	const n = 40000
	counts := tb.pickCounts(t, n)
	withinShare(t, "s0", counts["s0"], n, 0.25, 0.01)
	withinShare(t, "s1", counts["s1"], n, 0.75, 0.01)
}

// LeastRequest with no request in flight follows the weights; with
// requests held it balances active/weight.
func TestWeightedLeastRequest(t *testing.T) {
	t.Parallel()
	tb := newTest(t, func(c *Config) { c.Rule = RuleLeastRequest; c.Filter = FilterNone }, weighted("", 0, 100, 300))
	const n = 40000
	counts := tb.pickCounts(t, n)
	withinShare(t, "idle s0", counts["s0"], n, 0.25, 0.01)

	// Hold every request: in-flight counts settle near 1:3.
	var held []Pick
	for range 400 {
		p, err := tb.Pick(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	a0, a1 := tb.ServerStats("s0").ActiveRequests(), tb.ServerStats("s1").ActiveRequests()
	withinShare(t, "held s0", int(a0), int(a0+a1), 0.25, 0.03)
	for _, p := range held {
		p.End()
	}
}

// ZoneAvoidance draws zones by live weight: zone a holds one server of
// weight 300, zone b three of weight 100: the zones split 1:1, and within
// b the servers 1:1:1.
func TestWeightedZoneDraw(t *testing.T) {
	t.Parallel()
	list := append(weighted("a", 0, 300), weighted("b", 1, 100, 100, 100)...)
	tb := newTest(t, func(c *Config) { c.Filter = FilterNone }, list) // ZoneAvoidance, zone aware
	const n = 40000
	counts := tb.pickCounts(t, n)
	withinShare(t, "zone a", counts["s0"], n, 0.5, 0.015)
	for _, id := range []string{"s1", "s2", "s3"} {
		withinShare(t, id, counts[id], n, 1.0/6, 0.015)
	}
	// Within a zone of mixed weights the rule's round robin is weighted.
	list = append(weighted("a", 0, 100, 300), weighted("b", 2, 200)...)
	tb = newTest(t, func(c *Config) { c.Filter = FilterNone }, list)
	counts = tb.pickCounts(t, n)
	withinShare(t, "s0", counts["s0"], n, 1.0/6, 0.015)
	withinShare(t, "s1", counts["s1"], n, 0.5, 0.015)
	withinShare(t, "s2", counts["s2"], n, 1.0/3, 0.015)
}

// Equal weights, whatever their value, build no table: the rules keep
// their unweighted paths and results.
func TestEqualWeightsBuildNoTable(t *testing.T) {
	t.Parallel()
	for _, ws := range [][]int{{0, 0, 0}, {100, 0, 100}, {7, 7, 7}} {
		tb := newTest(t, func(c *Config) { c.Rule = RuleRandom }, weighted("z", 0, ws...))
		snap := tb.snap.Load()
		if snap.full.wt != nil || snap.zones[0].view.wt != nil || snap.zones[0].weight != 0 {
			t.Errorf("weights %v: a weight table was built", ws)
		}
	}
	// The same seed gives the same picks with weights 0 and 100 (Random
	// and the zone draw use only the seeded randomness; round robin
	// starts at a random position).
	pick := func(w int) []string {
		list := zoned(3, "a", "b")
		for i := range list {
			list[i].Weight = w
		}
		tb := newTest(t, func(c *Config) { c.Rule = RuleRandom; c.Filter = FilterNone }, list)
		var ids []string
		for range 200 {
			s, _ := tb.Choose(t.Context())
			ids = append(ids, s.ID)
		}
		return ids
	}
	if a, b := pick(0), pick(100); !slices.Equal(a, b) {
		t.Fatal("weights 0 and 100 pick differently")
	}
}

// A weight change is a list change: the next snapshot picks by it, and
// the server keeps its statistics.
func TestWeightChangeRebuilds(t *testing.T) {
	t.Parallel()
	list := weighted("", 0, 100, 100)
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin; c.Filter = FilterNone }, list)
	st := tb.ServerStats("s1")
	v := tb.snap.Load().Version()
	list[1].Weight = 300
	if err := tb.SetServers(list); err != nil {
		t.Fatal(err)
	}
	if tb.snap.Load().Version() == v {
		t.Fatal("a weight change installed no snapshot")
	}
	if tb.ServerStats("s1") != st {
		t.Fatal("a weight change lost the server's statistics")
	}
	counts := tb.pickCounts(t, 400)
	if counts["s0"] != 100 || counts["s1"] != 300 {
		t.Fatalf("after the change: %v, want 100 and 300", counts)
	}
	list[1].Weight = MaxWeight + 1
	if err := tb.SetServers(list); err == nil {
		t.Fatal("a weight beyond MaxWeight was accepted")
	}
}

func TestWeightTable(t *testing.T) {
	t.Parallel()
	if newWeightTable(weightedServers(5)) != nil || newWeightTable(weightedServers(2, 2)) != nil {
		t.Fatal("a table for one server or equal weights")
	}
	wt := newWeightTable(weightedServers(200, 400, 600))
	if wt.total != 6 || wt.unit != 200 || !slices.Equal(wt.w, []uint32{1, 2, 3}) {
		t.Fatalf("table %+v", wt)
	}
	for i, want := range []uint64{200, 400, 600} {
		if got := wt.weight(i); got != want {
			t.Errorf("weight(%d) = %d, want %d", i, got, want)
		}
	}
}

func weightedServers(ws ...int) []*Server {
	var out []*Server
	for _, w := range ws {
		out = append(out, &Server{Weight: w})
	}
	return out
}

// The sweep's division-free arithmetic agrees with plain division: round
// robin position k is slot k mod N on pass k / N (of k's low 32 bits).
func TestWeightTableArithmetic(t *testing.T) {
	t.Parallel()
	for _, ws := range [][]int{{1, 2}, {1, 1000}, {3, 5, 7, 11, 13}, {1000, 1, 1, 1, 1, 1, 1, 999}} {
		list := weightedServers(ws...)
		v := listView(list)
		v.setWeights(nil)
		n := uint64(len(ws))
		for _, k := range []uint64{0, 1, n - 1, n, n + 1, 12345, 1<<32 - 1, 1 << 32, 1<<40 + 7, ^uint64(0)} {
			k32 := uint64(uint32(k))
			slot, pass := k32%n, k32/n
			e := v.wt.alias[slot]
			step := uint32(min(uint64(e.share)<<(32-aliasBits), 1<<32-1))
			want := list[slot]
			if uint32(pass)*step+uint32(slot*0x9e3779b9) >= step {
				want = list[e.alias]
			}
			if got := v.at(k); got != want {
				t.Errorf("weights %v: at(%d) = %p, want %p (slot %d, pass %d)", ws, k, got, want, slot, pass)
			}
		}
	}
}

// Over any window of whole passes, round robin gives every server its
// weight's share give or take one pick per slot it appears in (plus the
// alias table's rounding): Bresenham's rule per slot.
func TestWeightedRoundRobinBound(t *testing.T) {
	t.Parallel()
	rnd := testutil.NewRand(7, 11)
	sets := [][]int{{1, 3}, {100, 200, 100, 300, 500}, {1000, 1, 1, 1, 1, 1, 1, 999}, {7, 11, 13, 17, 19, 23, 29}}
	random := make([]int, 300)
	for i := range random {
		random[i] = 1 + rnd.IntN(MaxWeight)
	}
	sets = append(sets, random)
	for _, ws := range sets {
		list := weightedServers(ws...)
		v := listView(list)
		v.setWeights(nil)
		wt := v.wt
		n := len(ws)
		index := make(map[*Server]int, n)
		for i, s := range list {
			index[s] = i
		}
		slots := make([]int, n) // slots holding server i
		for j, e := range wt.alias {
			slots[j]++
			if int(e.alias) != j {
				slots[e.alias]++
			}
		}
		for range 50 {
			passes := 1 + rnd.IntN(300)
			start := uint64(rnd.IntN(1<<20)) * uint64(n) // a pass's first position
			counts := make([]int, n)
			for k := start; k < start+uint64(passes*n); k++ {
				counts[index[v.at(k)]]++
			}
			for i, w := range ws {
				ideal := float64(passes*n) * float64(w) / float64(wt.total*wt.unit)
				tol := float64(slots[i]) + float64(passes*slots[i])/(1<<aliasBits) + 1e-9
				if math.Abs(float64(counts[i])-ideal) > tol {
					t.Fatalf("weights %v, %d passes from %d: server %d (weight %d, in %d slots) picked %d times, want %.2f +- %.2f",
						ws[:min(n, 8)], passes, start, i, w, slots[i], counts[i], ideal, tol)
				}
			}
		}
	}
}

// BestAvailable divides active requests by weight: with every request
// held, servers of weights 100 and 300 end with in-flight counts of 1:3.
func TestWeightedBestAvailable(t *testing.T) {
	t.Parallel()
	for _, filter := range []string{FilterNone, FilterZonePreference} {
		list := append(weighted("a", 0, 100, 300), weighted("b", 2, 100, 300)...)
		tb := newTest(t, func(c *Config) { c.Rule = RuleBestAvailable; c.Filter = filter }, list)
		var held []Pick
		for range 800 {
			p, err := tb.Pick(WithZone(t.Context(), "a"))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, p)
		}
		a0, a1 := tb.ServerStats("s0").ActiveRequests(), tb.ServerStats("s1").ActiveRequests()
		if a0+a1 != 800 || a0 < 195 || a0 > 205 {
			t.Errorf("filter %s: in flight %d and %d, want 200 and 600", filter, a0, a1)
		}
		for _, p := range held {
			p.End()
		}
	}
}

// The alias table gives each server its weight's probability, to the
// table's precision.
func TestWeightTableAlias(t *testing.T) {
	t.Parallel()
	for _, ws := range [][]int{{1, 3}, {1, 1000}, {3, 5, 7, 11, 13}, {1000, 1, 1, 1, 1, 1, 1, 999}} {
		var list []*Server
		for _, w := range ws {
			list = append(list, &Server{Weight: w})
		}
		wt := newWeightTable(list)
		n := float64(len(ws))
		got := make([]float64, len(ws))
		for i, e := range wt.alias {
			share := float64(e.share) / (1 << aliasBits)
			got[i] += share / n
			got[e.alias] += (1 - share) / n
		}
		sum := 0
		for _, w := range ws {
			sum += w
		}
		for i, w := range ws {
			if want := float64(w) / float64(sum); math.Abs(got[i]-want) > 1e-5 {
				t.Errorf("weights %v: server %d drawn with probability %.7f, want %.7f", ws, i, got[i], want)
			}
		}
	}
}
