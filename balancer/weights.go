package balancer

import "math/bits"

// Instance weights (Server.Weight), as Envoy's and grpc-go's weighted round
// robin and Nacos's weights: a server gets traffic in proportion to its
// weight. A view whose servers all weigh the same has no weight table and
// its rules take the unweighted paths unchanged, so equal weights cost
// nothing; a view of mixed weights gets a table built with its snapshot.

// weightTable is the cumulative weights of a view's servers, divided by
// their greatest common divisor: server i owns the points
// [cum[i-1], cum[i]) of [0, total). A pick maps a point to its server
// through a guide table, as the guide-table method of sampling does:
// [0, total) is cut into buckets of 2^shift points, about one per server,
// and guide[b] is the server owning bucket b's first point, so the server
// owning a point of bucket b is between guide[b] and guide[b+1]: usually
// one or two candidates, searched in halves (O(log N) at worst, when many
// light servers share one bucket). A pick allocates nothing and divides
// nothing: remainders are computed with a precomputed reciprocal.
//
// Round robin walks the points in the order k * stride mod total, k the
// round-robin counter: stride is coprime to total, so every total
// consecutive picks visit each point once, and each server gets exactly
// its weight's share; stride near total x 0.618 (the golden ratio) spreads
// a server's points over the cycle, so a heavy server's picks are
// interleaved with the others' (smooth, as smooth weighted round robin and
// EDF are) rather than consecutive.
//
// Random draws use the alias table instead (random): O(1), one slot read.
type weightTable struct {
	cum    []uint32 // cumulative weights; at most 10,000 x 1,000 per 10,000 servers
	guide  []uint32 // one per bucket, then len(cum)-1
	shift  uint
	total  uint64
	inv    uint64 // floor((2^64 - 1) / total), for mod
	stride uint64
	alias  []aliasSlot // for weighted random draws
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
	t := &weightTable{cum: make([]uint32, len(servers)), unit: uint64(g), scale: 1}
	if r != nil {
		t.scale = uint64(r.scale)
	}
	acc := uint64(0)
	for i, s := range servers {
		acc += uint64(r.weight(s) / g)
		t.cum[i] = uint32(acc)
	}
	t.total = acc
	t.inv = ^uint64(0) / acc
	t.stride = coprimeNear(acc, acc*618/1000)
	// Buckets of 2^shift points, the largest power of two at most the
	// mean weight: at most 2 x len(cum) buckets.
	for acc>>(t.shift+1) >= uint64(len(t.cum)) {
		t.shift++
	}
	buckets := (acc + 1<<t.shift - 1) >> t.shift
	t.guide = make([]uint32, buckets+1)
	for b := range buckets {
		t.guide[b] = uint32(t.search(b<<t.shift, 0, len(t.cum)-1))
	}
	t.guide[buckets] = uint32(len(t.cum) - 1)
	t.buildAlias()
	return t
}

// at returns the index of the server owning point x (< total): the first
// i with cum[i] > x.
func (t *weightTable) at(x uint64) int {
	b := x >> t.shift
	return t.search(x, int(t.guide[b]), int(t.guide[b+1]))
}

// search returns the first i in [lo, hi] with cum[i] > x; there is one.
func (t *weightTable) search(x uint64, lo, hi int) int {
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if uint64(t.cum[mid]) > x {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// weight returns server i's weight, in units of 1/scale of a weight.
func (t *weightTable) weight(i int) uint64 {
	w := uint64(t.cum[i])
	if i > 0 {
		w -= uint64(t.cum[i-1])
	}
	return w * t.unit
}

// mod returns y mod total. The quotient estimated with the reciprocal is
// at most 2 short, so at most two corrections follow.
func (t *weightTable) mod(y uint64) uint64 {
	q, _ := bits.Mul64(y, t.inv)
	r := y - q*t.total
	for r >= t.total {
		r -= t.total
	}
	return r
}

// roundRobin returns the index of round-robin position k.
func (t *weightTable) roundRobin(k uint64) int {
	return t.at(t.mod(t.mod(k) * t.stride)) // < total^2 < 2^62 (slow start keeps total < 2^31): no overflow
}

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

// buildAlias makes the alias table of the weights (Vose's method: O(N)).
func (t *weightTable) buildAlias() {
	n := len(t.cum)
	t.alias = make([]aliasSlot, n)
	// Each slot holds n x weight / total of its server, in units of
	// 2^-aliasBits, as integers so that the table is exact in them.
	const one = 1 << aliasBits
	scaled := make([]uint64, n)
	prev := uint64(0)
	for i, c := range t.cum {
		w := uint64(c) - prev
		prev = uint64(c)
		scaled[i] = w * uint64(n) * one / t.total
	}
	var small, large []int
	for i, v := range scaled {
		if v < one {
			small = append(small, i)
		} else {
			large = append(large, i)
		}
	}
	for len(small) > 0 && len(large) > 0 {
		l, g := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		t.alias[l] = aliasSlot{share: uint32(scaled[l]), alias: uint32(g)}
		scaled[g] -= one - scaled[l]
		if scaled[g] < one {
			large = large[:len(large)-1]
			small = append(small, g)
		}
	}
	// What is left holds (up to rounding) a whole slot: its own server.
	for _, i := range append(small, large...) {
		t.alias[i] = aliasSlot{share: one, alias: uint32(i)}
	}
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

// coprimeNear returns the first number from near up that is coprime to n
// (1 for n <= 2).
func coprimeNear(n, near uint64) uint64 {
	if n <= 2 {
		return 1
	}
	for s := max(near, 1); ; s++ {
		if gcd(int(s), int(n)) == 1 {
			return s
		}
	}
}
