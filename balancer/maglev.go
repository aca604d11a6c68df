package balancer

import (
	"cmp"
	"math/bits"
	"slices"
	"sync"
)

// Maglev sends equal keys (WithKey) to the same server through a Maglev
// lookup table (Eisenbud et al., NSDI 2016, as Envoy's maglev policy): a
// table of M slots, M a prime about 100 times the number of servers, in
// which every server owns M/N slots (rounded up or down) spread over the
// table. A keyed pick hashes the key to a slot: O(1), one table read. The
// table is built once per list change, from the servers' IDs only, so
// every gateway with the same list sends a key to the same server,
// whatever the order of the list.
//
// When a server leaves, its slots go to the others and a few more slots
// change hands (Maglev trades a little extra movement for its even spread
// and its O(1) lookup): with 10 servers, removing one moves its tenth of
// the keys and about 1 % more; rendezvous hashing (the Rendezvous type)
// moves exactly the leaving server's keys but costs O(servers) per pick.
//
// A key whose server's breaker is open goes to the next slot whose server's
// breaker is closed, so its keys spread over the others while it is
// tripped and come back when it closes. Servers marked down are not in the
// view, so they are not in its table. Without a key it is round robin.
//
// The table of the balancer's whole list is built when the list changes
// (SetServers and the other list changes pay for it); the table of a zone's
// view, used when the zone choice settles on one zone, is built by the
// first keyed pick that needs it.
type Maglev struct {
	c  *counter
	mu sync.Mutex // serialises lazy table builds
}

// NewMaglev returns a Maglev rule.
func NewMaglev() *Maglev { return &Maglev{c: newCounter()} }

// Choose implements Rule.
func (r *Maglev) Choose(p PickInfo) (*Server, error) {
	v := p.View
	if len(v.servers) == 0 {
		return nil, nil
	}
	key, ok := p.Key()
	if !ok {
		return r.c.roundRobin(v.servers), nil
	}
	t := v.table.Load()
	if t == nil {
		t = r.build(v)
	}
	return t.lookup(&p, v.servers, keyHash(key)), nil
}

// build makes the table of v once; concurrent picks wait for it, as a
// key must not go anywhere else meanwhile.
func (r *Maglev) build(v *View) *maglevTable {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := v.table.Load(); t != nil {
		return t
	}
	t := buildMaglev(v.servers)
	v.table.Store(t)
	return t
}

// prepare builds the table of a new snapshot's full view before it is
// installed, so that keyed picks never wait for it.
func (r *Maglev) prepare(_ *Balancer, s *Snapshot) {
	if s.full.table.Load() == nil && len(s.full.servers) > 0 {
		s.full.table.Store(buildMaglev(s.full.servers))
	}
}

// maglevProbes is how many slots after its own a key whose server is
// tripped tries before the view is scanned for a server that is not.
const maglevProbes = 64

// maglevTable is the lookup table of one view: slot -> index in the view's
// servers.
type maglevTable struct {
	slots []int32
}

// lookup returns the server of the key's slot, or of the next slot whose
// server's breaker is closed; when every server is tripped, the key's own.
func (t *maglevTable) lookup(p *PickInfo, servers []*Server, kh uint64) *Server {
	m := uint64(len(t.slots))
	slot, _ := bits.Mul64(kh, m) // kh scaled to [0, m): no division
	own := servers[t.slots[slot]]
	if !mayBeTripped(own) || !p.Tripped(own) {
		return own
	}
	for range min(maglevProbes, len(t.slots)) {
		if slot++; slot == m {
			slot = 0
		}
		if s := servers[t.slots[slot]]; !mayBeTripped(s) || !p.Tripped(s) {
			return s
		}
	}
	// Most servers are tripped: scan from a place of the key's own.
	n := len(servers)
	start := int(kh % uint64(n))
	for i := range n {
		if s := servers[(start+i)%n]; !p.Tripped(s) {
			return s
		}
	}
	return own
}

// mayBeTripped is a cheap test, without the clock, that lets most picks
// skip reading it: a server below the breaker's threshold is not tripped.
func mayBeTripped(s *Server) bool {
	st := &s.inst.stats
	return st.failures.Load() >= int64(st.shared.breaker.Threshold)
}

// keyHash hashes a key for the table: FNV-1a spread by splitmix64's
// finaliser. It is the same in every process, as the table is.
func keyHash(key string) uint64 { return mix64(fnv64(key)) }

// maglevTableFactor is the table's size per server: with M/N about 100,
// every server owns within 1 % of the same share of slots.
const maglevTableFactor = 100

// maglevMaxTable caps the table (a prime): 2^18 - 5. Beyond about 2,600
// servers the shares spread more (ceil(M/N) / floor(M/N): within 4 % at
// 10,000 servers), and the build stays in milliseconds.
const maglevMaxTable = 262139

// maglevSize returns the table size for n servers: the smallest prime at
// or above maglevTableFactor * n, capped; always above n.
func maglevSize(n int) int {
	want := min(max(maglevTableFactor*n, 101), maglevMaxTable)
	want = max(want, n+1)
	for m := want; ; m++ {
		if isPrime(m) {
			return m
		}
	}
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	if n%2 == 0 {
		return n == 2
	}
	for d := 3; d*d <= n; d += 2 {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// buildMaglev fills a table for servers (a view's, non-empty) with
// Maglev's population: servers take turns, each claiming the next free slot
// of its own permutation of the table (offset + j*skip mod M), so each
// owns floor or ceil of M/N slots. Servers take their turns in the order
// of their IDs' hashes, so the table does not depend on the list's order.
func buildMaglev(servers []*Server) *maglevTable {
	n := len(servers)
	m := maglevSize(n)
	type perm struct {
		h          uint64
		idx        int32
		next, skip uint32
	}
	ps := make([]perm, n)
	for i, s := range servers {
		ps[i] = perm{h: fnv64(s.ID), idx: int32(i)}
	}
	slices.SortFunc(ps, func(a, b perm) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(servers[a.idx].ID, servers[b.idx].ID)
	})
	for i := range ps {
		h := ps[i].h
		ps[i].next = uint32(mix64(h^0x9e3779b97f4a7c15) % uint64(m))
		ps[i].skip = uint32(mix64(h^0xc2b2ae3d27d4eb4f)%uint64(m-1)) + 1
	}
	slots := make([]int32, m)
	for i := range slots {
		slots[i] = -1
	}
	um := uint32(m)
	filled := 0
	for {
		for i := range ps {
			p := &ps[i]
			c := p.next
			for slots[c] >= 0 {
				if c += p.skip; c >= um {
					c -= um
				}
			}
			slots[c] = p.idx
			if c += p.skip; c >= um {
				c -= um
			}
			p.next = c
			if filled++; filled == m {
				return &maglevTable{slots: slots}
			}
		}
	}
}

var _ Rule = (*Maglev)(nil)
