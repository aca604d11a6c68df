package balancer

// Instance weights (Server.Weight), as Envoy's and grpc-go's weighted round
// robin and Nacos's weights: a server gets traffic in proportion to its
// weight. A view whose servers all weigh the same has no weight table and
// its rules take the unweighted paths unchanged, so equal weights cost
// nothing; a view of mixed weights gets a table built with its snapshot.

// weightTable is what the rules need of a view's weights, divided by
// their greatest common divisor: each server's weight (w), and Walker's
// alias table over them (alias): one slot per server, slot j holding its
// own server for a share of it and another server (its alias) for the
// rest, every slot the same size, so that a slot and a fraction drawn
// uniformly give each server its weight's share.
//
// Random draws a slot and a fraction at random (random): O(1), one slot
// read.
//
// Round robin (View.weightedAt) sweeps the slots in order, one per pick, as the unweighted
// round robin sweeps the servers, and each slot alternates between its own
// server and its alias by Bresenham's rule: on pass p (the p-th sweep)
// slot j yields its own server when frac(p x share_j + phase_j) < share_j,
// so over any P consecutive passes it does so floor(P x share_j) or
// ceil(P x share_j) times. A server's picks over any window of passes are
// thus its weight's share give or take one per slot it appears in, spread
// through each pass by the sweep and across passes by the rule (smooth, as
// smooth weighted round robin and EDF are); the phases, spread by the
// golden ratio, keep the slots from switching together. A pick is O(1),
// allocates nothing, divides nothing, takes no branch on the choice, and
// reads the slots and the servers in order, as the unweighted pick does,
// with each alias near its slot (buildAlias): a table of 10,000 servers is
// read from cache, not from memory at random.
type weightTable struct {
	w     []uint32    // weights, divided by unit; below 2^31 in total
	total uint64      // sum of w
	alias []aliasSlot // one per server
	// unit is the greatest common divisor the weights were divided by,
	// scale the ramp's (1 without slow start): server i weighs
	// weight(i) / scale (slowstart.go).
	unit, scale uint64
}

// newWeightTable returns the table of servers, or nil when they all weigh
// the same (or there are fewer than two).
func newWeightTable(servers []*Server) *weightTable { return weightTableOf(servers, nil) }

// weightTableOf is newWeightTable over the servers' live weights while
// some ramp (r, nil when none: slowstart.go).
func weightTableOf(servers []*Server, r *ramp) *weightTable {
	if len(servers) < 2 {
		return nil
	}
	first := r.weight(servers[0])
	g := 0
	mixed := false
	for _, s := range servers {
		w := r.weight(s)
		mixed = mixed || w != first
		g = gcd(g, w)
	}
	if !mixed {
		return nil
	}
	t := &weightTable{w: make([]uint32, len(servers)), unit: uint64(g), scale: 1}
	if r != nil {
		t.scale = uint64(r.scale)
	}
	for i, s := range servers {
		t.w[i] = uint32(r.weight(s) / g)
		t.total += uint64(t.w[i])
	}
	t.buildAlias()
	return t
}

// weight returns server i's weight, in units of 1/scale of a weight.
func (t *weightTable) weight(i int) uint64 { return uint64(t.w[i]) * t.unit }

// random returns the index of a server drawn in proportion to the weights,
// with Walker's alias method: one random number gives a slot and a
// fraction; the slot's server when the fraction is below its share, else
// the slot's alias. O(1), one table entry read.
func (t *weightTable) random(r Rand) int {
	x := uint64(intN(r, len(t.alias)<<aliasBits))
	e := t.alias[x>>aliasBits]
	if uint32(x&(1<<aliasBits-1)) < e.share {
		return int(x >> aliasBits)
	}
	return int(e.alias)
}

// aliasBits is the precision of an alias slot's share: 2^-20, so a
// server's probability is exact to about one part in a million.
const aliasBits = 20

// aliasSlot is one slot of the alias table: its own server is drawn with
// probability share / 2^aliasBits, alias otherwise.
type aliasSlot struct {
	share uint32
	alias uint32
}

// sweepSlot is round robin's copy of an alias slot (View.sweep): step is
// its own server's share as a fraction of 2^32 (2^32 - 1 for a whole
// slot), phase its offset in Bresenham's rule, alias its alias server
// itself, so that a pick reads one slot and no index.
type sweepSlot struct {
	step, phase uint32
	alias       *Server
}

// buildAlias makes the alias table of the weights, by Vose's method (O(N))
// with its two work lists walked in index order: a slot's alias is the
// first server after it, or near it, with weight to spare, so that round
// robin's sweep reads the aliases near the slots, in order, rather than
// anywhere in the list.
func (t *weightTable) buildAlias() {
	n := len(t.w)
	// Each slot holds n x weight / total of its server, in units of
	// 2^-aliasBits, as integers so that the table is exact in them.
	const one = 1 << aliasBits
	scaled := make([]uint64, n)
	small := make([]bool, n) // below one slot at the start
	t.alias = make([]aliasSlot, n)
	for i, w := range t.w {
		scaled[i] = uint64(w) * uint64(n) * one / t.total
		small[i] = scaled[i] < one
		t.alias[i] = aliasSlot{share: one, alias: uint32(i)} // a whole slot, unless paired below
	}
	next := func(i int, wantSmall bool) int {
		for i < n && small[i] != wantSmall {
			i++
		}
		return i
	}
	// Pair each small server with the current large one, which gives its
	// slot's rest; a large one left with less than a slot is paired next,
	// with the large one after it. What is never paired holds (up to
	// rounding) a whole slot: its own server.
	s, g, turned := next(0, true), next(0, false), -1
	for g < n {
		l := turned
		if l < 0 {
			if s >= n {
				break
			}
			l, s = s, next(s+1, true)
		}
		turned = -1
		t.alias[l] = aliasSlot{share: uint32(scaled[l]), alias: uint32(g)}
		scaled[g] -= one - scaled[l]
		if scaled[g] < one {
			turned, g = g, next(g+1, false)
		}
	}
}

// sweepOf returns round robin's slots (View.sweep): the alias table's, over
// servers, the table's.
func (t *weightTable) sweepOf(servers []*Server) []sweepSlot {
	sweep := make([]sweepSlot, len(t.alias))
	for j, e := range t.alias {
		sweep[j] = sweepSlot{
			step:  uint32(min(uint64(e.share)<<(32-aliasBits), 1<<32-1)),
			phase: uint32(j) * 0x9e3779b9, // j x 2^32 / the golden ratio
			alias: servers[e.alias],
		}
	}
	return sweep
}

// weightOf returns the sum of the servers' live weights.
func weightOf(servers []*Server, r *ramp) int {
	sum := 0
	for _, s := range servers {
		sum += r.weight(s)
	}
	return sum
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
