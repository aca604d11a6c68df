package balancer

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// Maglev sends equal keys (WithKey) to the same server through a Maglev
// lookup table (Eisenbud et al., NSDI 2016, as Envoy's maglev policy): a
// table of M = 65,537 slots (a larger prime past 10,922 servers) in which
// every server owns M/N slots, rounded up or down, spread over the table. A
// keyed pick hashes the key to a slot: O(1), one table read. The table is
// built once per list change (about 1-2 ms), from the servers' IDs only,
// so every gateway with the same list sends a key to the same server,
// whatever the order of the list.
//
// When a server leaves, its slots go to the others and a few more slots
// change hands (Maglev trades a little extra movement for its even spread
// and its O(1) lookup): removing one of N servers moves its 1/N of the
// keys and at most about 1 % of all keys besides (0.2 % at N = 10, 0.6 %
// at N = 1,000); a server that comes back takes exactly its keys back.
// Rendezvous hashing (the Rendezvous type) moves only the leaving server's
// keys but costs O(servers) per pick.
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
// servers, in 16 bits while the view has fewer than 65,536 servers.
type maglevTable struct {
	small []uint16
	large []int32
	m     uint64
}

func (t *maglevTable) at(slot uint64) int {
	if t.small != nil {
		return int(t.small[slot])
	}
	return int(t.large[slot])
}

// lookup returns the server of the key's slot, or of the next slot whose
// server's breaker is closed; when every server is tripped, the key's own.
func (t *maglevTable) lookup(p *PickInfo, servers []*Server, kh uint64) *Server {
	slot, _ := bits.Mul64(kh, t.m) // kh scaled to [0, m): no division
	own := servers[t.at(slot)]
	if !mayBeTripped(own) || !p.Tripped(own) {
		return own
	}
	for range maglevProbes {
		if slot++; slot == t.m {
			slot = 0
		}
		if s := servers[t.at(slot)]; !mayBeTripped(s) || !p.Tripped(s) {
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
// skip reading it: a server below the breaker's threshold, never ejected,
// is not tripped.
func mayBeTripped(s *Server) bool {
	st := s.inst.view()
	return st.failureCount() >= int64(st.shared.breaker.Threshold) || st.ejectedUntil() != 0
}

// keyHash hashes a key for the table: FNV-1a spread by splitmix64's
// finaliser. It is the same in every process, as the table is.
func keyHash(key string) uint64 { return mix64(fnv64(key)) }

// KeyHash is the hash of a key that the keyed rules (Maglev) use:
// FNV-1a spread by splitmix64's finaliser, so that similar keys
// ("user-1", "user-2") spread. It is the same in every process and every
// release, for whatever must agree across gateways on a key (the Proxy's
// sticky canary splits). It allocates nothing.
func KeyHash(key string) uint64 { return keyHash(key) }

// maglevSizes are the table sizes, primes (Maglev's permutations need
// one). The size must not follow the exact number of servers: a list that
// grows or shrinks by one would move nearly every key. 65,537 is Envoy's
// default.
var maglevSizes = [...]int{65537, 655373, 6553621}

// maglevMinShare is the fewest slots per server a size is used down to: at
// 65,537 slots, up to 10,922 servers (6 or 7 slots each, shares within 8 %
// of the mean); beyond, the next size, and every key moves once as the
// list crosses that count.
const maglevMinShare = 6

// maglevSize returns the table size for n servers.
func maglevSize(n int) int {
	for _, m := range maglevSizes {
		if n <= m/maglevMinShare {
			return m
		}
	}
	return maglevSizes[len(maglevSizes)-1]
}

// buildMaglev fills a table for servers (a view's, non-empty) with
// Maglev's population: servers take turns, each claiming the next free slot
// of its own permutation of the table (offset + j*skip mod M), so each
// owns floor or ceil of M/N slots. Servers take their turns in the order
// of their IDs' hashes, so the table does not depend on the list's order.
func buildMaglev(servers []*Server) *maglevTable {
	return buildMaglevSize(servers, maglevSize(len(servers)))
}

// buildMaglevSize is buildMaglev with a table of m slots, m a prime above
// len(servers).
func buildMaglevSize(servers []*Server, m int) *maglevTable {
	n := len(servers)
	ps := make([]maglevPerm, n)
	for i, s := range servers {
		ps[i] = maglevPerm{h: fnv64(s.ID), idx: int32(i)}
	}
	sortMaglevPerms(ps, servers)
	for i := range ps {
		h := ps[i].h
		ps[i].next = uint32(mix64(h^0x9e3779b97f4a7c15) % uint64(m))
		ps[i].skip = uint32(mix64(h^0xc2b2ae3d27d4eb4f)%uint64(m-1)) + 1
	}
	t := &maglevTable{m: uint64(m)}
	if n <= math.MaxUint16 {
		t.small = make([]uint16, m)
		fillMaglev(t.small, ps)
	} else {
		t.large = make([]int32, m)
		fillMaglev(t.large, ps)
	}
	return t
}

// maglevPerm is a server's permutation of the table: its slots are next,
// next+skip, next+2*skip, ... (mod M), and next is the first of them not
// yet known to be taken.
type maglevPerm struct {
	h          uint64
	idx        int32
	next, skip uint32
}

// fillMaglev runs Maglev's population into table (M slots, M below 2^31):
// servers take turns, each claiming the next free slot of its
// permutation. The cost is the probes' branch mispredictions (about one
// per claim), so the loop has no other branch to mispredict: the
// wrap-around mod M is a mask.
func fillMaglev[T uint16 | int32](table []T, ps []maglevPerm) {
	m := len(table)
	// Which slots are taken, in a bit set that stays in the L1 cache
	// (8 KB at 65,537 slots) while the probes run.
	taken := make([]uint64, (m+63)/64)
	um := uint32(m)
	for filled := 0; ; {
		for i := range ps {
			p := &ps[i]
			c, skip := p.next, p.skip
			for taken[c>>6]&(1<<(c&63)) != 0 {
				c = wrapMaglev(c+skip, um)
			}
			taken[c>>6] |= 1 << (c & 63)
			table[c] = T(p.idx)
			p.next = wrapMaglev(c+skip, um)
			if filled++; filled == m {
				return
			}
		}
	}
}

// wrapMaglev returns c mod m for c below 2m (and 2m below 2^31), without
// a branch.
func wrapMaglev(c, m uint32) uint32 {
	c -= m
	return c + m&uint32(int32(c)>>31)
}

// sortMaglevPerms orders the permutations by their ID's hash, ties by ID:
// a radix sort on the hash for long lists (a comparison sort of 10,000
// costs more than the table's probes), then the rare runs of equal hashes
// by ID.
func sortMaglevPerms(ps []maglevPerm, servers []*Server) {
	byID := func(a, b maglevPerm) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(servers[a.idx].ID, servers[b.idx].ID)
	}
	if len(ps) < 256 {
		slices.SortFunc(ps, byID)
		return
	}
	tmp := make([]maglevPerm, len(ps))
	src, dst := ps, tmp
	for shift := 0; shift < 64; shift += 8 {
		var count [256]int
		for k := range src {
			count[byte(src[k].h>>shift)]++
		}
		if count[byte(src[0].h>>shift)] == len(src) {
			continue // every hash has this byte
		}
		pos := 0
		for d, c := range count {
			count[d] = pos
			pos += c
		}
		for k := range src {
			d := byte(src[k].h >> shift)
			dst[count[d]] = src[k]
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &ps[0] {
		copy(ps, src)
	}
	for lo := 0; lo < len(ps); {
		hi := lo + 1
		for hi < len(ps) && ps[hi].h == ps[lo].h {
			hi++
		}
		if hi-lo > 1 {
			slices.SortFunc(ps[lo:hi], byID)
		}
		lo = hi
	}
}

var _ Rule = (*Maglev)(nil)
