package balancer

import (
	"math/bits"
	"slices"
	"strings"
	"sync/atomic"
)

// Snapshot is one immutable state of a balancer's list. It is rebuilt on
// every list change and read by picks without locks. Slices returned by its
// methods are shared: do not modify them.
type Snapshot struct {
	version uint64
	all     []*Server    // every listed server, in list order
	full    View         // the alive servers, all zones
	zones   []*zoneGroup // sorted by name (see group)
	// tiers is the alive servers by region, nearest first, under
	// Config.Region when they span several regions; nil otherwise
	// (locality.go).
	tiers []*regionTier
	// decision is the zone choice of the picks over this snapshot (zone.go),
	// made with it and remade when its inputs change; never nil once the
	// snapshot is installed.
	decision atomic.Pointer[zoneDecision]
	// replaced is closed when a newer snapshot is installed, so waiters
	// (the Retry rule, through PickInfo.Changed) wake up on list changes
	// instead of polling.
	replaced chan struct{}
	// ramp is the live weights while a server is in its slow-start
	// window (slowstart.go), nil otherwise.
	ramp *ramp
}

// View is a set of candidate servers for one pick: all alive servers of a
// snapshot, those the zone filter keeps, or those of one zone. Rules
// choose from a View (see PickInfo). A View is immutable and safe for
// concurrent use; it does not lead back to its balancer.
type View struct {
	servers []*Server
	// mod is the reciprocal of len(servers) for round-robin positions
	// (see at); set by setServers.
	mod   uint64
	zones []*zoneGroup // the zones present in servers
	snap  *Snapshot
	// wt is the view's weight table (weights.go), nil when its servers
	// all weigh the same: then the rules take their unweighted paths.
	// sweep is its alias table for round robin (weightedAt), held here
	// beside servers and mod so that a pick reads no other struct.
	wt    *weightTable
	sweep []sweepSlot
	// weights caches WeightedResponseTime's cumulative weights for this view.
	weights atomic.Pointer[responseWeights]
	// least is BestAvailable's index of the view's servers by active
	// requests (leastactive.go); table is Maglev's lookup table (maglev.go).
	least atomic.Pointer[activeTree]
	table atomic.Pointer[maglevTable]
}

// setServers sets the view's servers and what round robin over them
// precomputes.
func (v *View) setServers(servers []*Server) {
	v.servers = servers
	v.mod = 0
	if n := len(servers); n > 0 {
		v.mod = ^uint64(0)/uint64(n) + 1 // 0 for n = 1, which at reads as index 0
	}
}

// listView is an unweighted view over list, for round robin over a list
// that is not a snapshot's view.
func listView(list []*Server) *View {
	v := new(View)
	v.setServers(list)
	return v
}

// at returns the server at round-robin position k of a view that has
// servers: in proportion to the weights when they differ (weights.go),
// otherwise k mod len(servers), the remainder of k's low 32 bits taken by
// multiplying with the precomputed reciprocal instead of dividing
// (Lemire's fastmod: a division costs several times the whole pick). The
// low 32 bits wrap every 2^32 positions, where one server gets two picks
// in a row, as grpc-go's round_robin does.
func (v *View) at(k uint64) *Server {
	if v.sweep != nil {
		return v.weightedAt(k)
	}
	return v.servers[v.index(k)]
}

// index is the index of round-robin position k in a view whose weights
// are all equal (at).
func (v *View) index(k uint64) uint64 {
	i, _ := bits.Mul64(v.mod*uint64(uint32(k)), uint64(len(v.servers)))
	return i
}

// setWeights builds the view's weight table and round robin's slots over
// its servers' live weights while some ramp (r, nil when none), or clears
// them when the weights are all equal. It reports whether they differ.
func (v *View) setWeights(r *ramp) bool {
	v.wt, v.sweep = weightTableOf(v.servers, r), nil
	if v.wt != nil {
		v.sweep = v.wt.sweepOf(v.servers)
	}
	return v.wt != nil
}

// weightedRandom returns a server of a view whose weights differ, drawn in
// proportion to them: a slot and a fraction at random, and the slot's own
// server or its alias by the fraction (Walker's alias method, O(1)). The
// slot and its own server are read side by side and the choice takes no
// branch, so that a draw waits on one memory read, as the unweighted draw
// does.
func (v *View) weightedRandom(r Rand) *Server {
	x := uint64(intN(r, len(v.sweep)<<aliasBits))
	slot := x >> aliasBits
	e := &v.sweep[slot]
	own, alias := v.servers[slot], e.alias
	if uint32(x)<<(32-aliasBits) >= e.step {
		own = alias
	}
	return own
}

// weightedAt is at for a view whose weights differ: slot k mod N on pass k / N (of k's low 32 bits, which wrap
// every 2^32 positions), its own server or its alias by the slot's
// Bresenham rule (weights.go). The quotient and the remainder come from
// one multiplication by the reciprocal that at uses (Lemire's fastmod).
func (v *View) weightedAt(k uint64) *Server {
	pass, low := bits.Mul64(v.mod, uint64(uint32(k)))
	slot, _ := bits.Mul64(low, uint64(len(v.sweep)))
	e := &v.sweep[slot]
	own, alias := v.servers[slot], e.alias
	if uint32(pass)*e.step+e.phase >= e.step {
		own = alias
	}
	return own
}

// zoneGroup is the alive servers of one zone.
type zoneGroup struct {
	name string // lower case
	idx  int    // its index in the snapshot's zones
	view View
	// weight is the sum of its servers' weights when the snapshot's
	// weights differ, 0 when they are all equal: zone draws weigh zones by
	// it, or by their instance counts when 0.
	weight int
}

// Servers returns the view's servers. Do not modify the slice.
func (v *View) Servers() []*Server { return v.servers }

// Len returns the number of servers in the view.
func (v *View) Len() int { return len(v.servers) }

// Version returns the snapshot version, growing with every list change.
func (s *Snapshot) Version() uint64 { return s.version }

// All returns every listed server, alive or not, in list order.
func (s *Snapshot) All() []*Server { return s.all }

// Reachable returns the alive servers, in list order.
func (s *Snapshot) Reachable() []*Server { return s.full.servers }

// Full returns the view over every alive server.
func (s *Snapshot) Full() *View { return &s.full }

// Zone returns the view over the alive servers of zone (case-insensitive),
// or nil when the zone has none.
func (s *Snapshot) Zone(zone string) *View {
	if g := s.group(lowerASCII(zone)); g != nil {
		return &g.view
	}
	return nil
}

// group returns the zone group of name (lower case), nil for none: a
// binary search of the zones, which are few, where a map took some 250
// bytes a snapshot.
func (s *Snapshot) group(name string) *zoneGroup {
	if i, ok := slices.BinarySearchFunc(s.zones, name, func(g *zoneGroup, name string) int { return strings.Compare(g.name, name) }); ok {
		return s.zones[i]
	}
	return nil
}

// Zones returns the names (lower case) of the zones with alive servers.
func (s *Snapshot) Zones() []string {
	out := make([]string, len(s.zones))
	for i, g := range s.zones {
		out[i] = g.name
	}
	return out
}

// buildSnapshot groups servers by zone, weighed by their live weights
// (r: nil when no server ramps). all is kept as given.
func buildSnapshot(version uint64, all []*Server, r *ramp) *Snapshot {
	s := &Snapshot{version: version, all: all, ramp: r, replaced: make(chan struct{})}
	// The lists share their backing arrays where they hold the same
	// servers (every server alive: the alive list is all; one zone: its
	// list is the alive list), 8 bytes a server each: no list of a
	// snapshot is ever written once built.
	// One read of each server's flag (a subset's snapshot is built
	// without the lock that changes them): up is all's prefix until the
	// first server down, then a list of its own.
	up := all
	counts := make(map[string]int)
	for i, srv := range all {
		if !srv.inst.alive.Load() {
			if len(up) == len(all) {
				up = append(make([]*Server, 0, len(all)-1), all[:i]...)
			}
			continue
		}
		if len(up) < len(all) {
			up = append(up, srv)
		}
		counts[srv.zoneKey()]++
	}
	s.zones = make([]*zoneGroup, 0, len(counts))
	for name, n := range counts {
		g := &zoneGroup{name: name}
		if len(counts) == 1 {
			g.view.servers = up
		} else {
			g.view.servers = make([]*Server, 0, n)
		}
		g.view.snap = s
		s.zones = append(s.zones, g)
	}
	slices.SortFunc(s.zones, func(a, b *zoneGroup) int { return strings.Compare(a.name, b.name) })
	for i, g := range s.zones {
		g.idx = i
		g.view.zones = s.zones[i : i+1 : i+1] // never appended to
	}
	if len(s.zones) > 1 {
		for _, srv := range up {
			g := s.group(srv.zoneKey())
			g.view.servers = append(g.view.servers, srv)
		}
	}
	for _, g := range s.zones {
		g.view.setServers(g.view.servers)
	}
	s.full = View{zones: s.zones, snap: s}
	s.full.setServers(up)
	if s.full.setWeights(r) {
		for _, g := range s.zones {
			g.view.setWeights(r)
			g.weight = weightOf(g.view.servers, r)
		}
	}
	return s
}

// sameArray reports whether a and b start at the same element of one
// backing array.
func sameArray(a, b []*Server) bool { return len(a) > 0 && len(b) > 0 && &a[0] == &b[0] }

// lowerASCII lower-cases s without allocating when it is already lower case.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; c >= 'A' && c <= 'Z' {
					b[j] = c + ('a' - 'A')
				}
			}
			return string(b)
		}
	}
	return s
}
