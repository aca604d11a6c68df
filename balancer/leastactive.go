package balancer

import (
	"sync"
	"sync/atomic"
)

// activeTree is BestAvailable's index of one view's servers by active
// requests: a tree of fan-out 8 whose leaves are the servers and whose
// nodes hold, packed in one word, the smallest key below them and how many
// leaves have it. A leaf's key is its server's active-request count, or
// trippedKey while its breaker is open. A pick walks from the root to one
// of the least-loaded leaves, chosen uniformly among them by one random
// number: O(log8 N) word reads (5 levels at 10,000 servers), no lock.
//
// Request start and end (and breaker changes) update the server's leaf,
// in every tree of the current snapshot and of its subsets that holds the
// server, and the nodes above it through ServerStats.watch, with plain atomic
// stores: every writer stores a value computed from what is below, then
// reads again and stores again if what is below changed meanwhile. The
// last store to any word is therefore checked against the final state, and
// the tree is exact once updates stop; while they run, a pick may see a
// node a few nanoseconds stale, as any load-aware pick sees counts
// changing under it.
//
// Two things change without an event: an open breaker closes when its
// blackout ends, and an active count untouched for ActiveRequestsTimeout
// decays to zero. A pick that finds the tree's due time passed resyncs
// every leaf from the statistics (O(N), one pick at a time, the others
// carry on): at the earliest blackout end among the tripped servers, and
// every activeResyncDivisor-th of the decay timeout.
type activeTree struct {
	servers []*Server
	// levels[0] holds the leaves, padded to a multiple of fan with absent
	// words; the last level holds the root alone.
	levels  [][]atomic.Uint64
	shared  *statsShared
	version uint64 // the snapshot's, so watches never go back to an older tree
	// weights are the servers' live weights, in units of 1/scale of a
	// weight (weightTable.weight), when the view's differ (nil when
	// equal: the keys are the counts).
	weights []uint32
	scale   uint64

	due    atomic.Int64 // nanotime of the next resync
	syncMu sync.Mutex   // one resync at a time
}

const (
	fan     = 8
	keyBits = 32
	// trippedKey is a tripped server's key: above any count, below absent,
	// so a root with this key means every server is tripped.
	trippedKey = 1<<keyBits - 2
	absentKey  = 1<<keyBits - 1
	maxActive  = trippedKey - 1
	countMask  = 1<<keyBits - 1

	absentWord = absentKey << keyBits // count 0

	// activeResyncDivisor: decayed counts are noticed within
	// ActiveRequestsTimeout / activeResyncDivisor (37.5 s of 600 s).
	activeResyncDivisor = 16
)

// activeWatch tells a server's statistics which leaves to update: one in
// each tree of one snapshot's views that holds the server (the full view's,
// its zone's) and of the subsets built over that snapshot (subset.go): a
// request started or ended through any of them is seen by all at once.
type activeWatch struct {
	version uint64
	leaves  []treeLeaf
}

// treeLeaf is leaf i of tree t.
type treeLeaf struct {
	t *activeTree
	i int32
}

// changed is the hook ServerStats calls after a change of its active count
// or its breaker: it updates the leaves watching it, if any (only under
// BestAvailable). It costs one atomic load otherwise.
func (s *ServerStats) changed() {
	w := s.watch.Load()
	if w == nil {
		return
	}
	for _, l := range w.leaves {
		l.t.update(int(l.i), s)
	}
}

func word(key uint64, count uint64) uint64 { return key<<keyBits | count }

// leafWord computes a server's leaf. now is read only when the breaker
// may be open (now < 0: not read yet). decay applies the active-request
// timeout; the hooks skip it, as they run right after the count changed.
// expiry is when an open breaker closes, 0 when it is not open.
func leafWord(st *ServerStats, now int64, decay bool) (w uint64, expiry int64) {
	if end := st.blackoutEnd(); end != 0 {
		if now < 0 {
			now = st.shared.nanotime()
		}
		if now < end {
			return word(trippedKey, 1), end
		}
	}
	a := st.active.Load()
	if decay && now-st.activeChanged.Load() > int64(st.shared.activeTimeout) {
		a = 0
	}
	return word(uint64(min(max(a, 0), maxActive)), 1), 0
}

// leafWord is the package's leafWord for leaf i: when the view's weights
// differ, the key of a server's count is the count divided by its weight,
// scaled by MaxWeight (a server of weight 1,000 keys its count, one of
// weight 100 ten times it), so the least key is the least load per weight.
// A weight in slow start is its live weight (slowstart.go).
func (t *activeTree) leafWord(i int, st *ServerStats, now int64, decay bool) (uint64, int64) {
	w, expiry := leafWord(st, now, decay)
	if t.weights == nil {
		return w, expiry
	}
	key := w >> keyBits
	if key >= trippedKey {
		return w, expiry
	}
	return word(min(key*MaxWeight*t.scale/uint64(t.weights[i]), maxActive), 1), expiry
}

// combine returns the node over kids: their smallest key and how many
// leaves below have it.
func combine(kids []atomic.Uint64) uint64 {
	best, count := uint64(absentKey), uint64(0)
	for i := range kids {
		w := kids[i].Load()
		switch k := w >> keyBits; {
		case k < best:
			best, count = k, w&countMask
		case k == best:
			count += w & countMask
		}
	}
	return word(best, count)
}

// update refreshes leaf i from st and the nodes above it.
func (t *activeTree) update(i int, st *ServerStats) {
	leaf := &t.levels[0][i]
	for {
		w, expiry := t.leafWord(i, st, -1, false)
		if leaf.Load() == w {
			break // someone stored it, and goes up
		}
		leaf.Store(w)
		if expiry != 0 {
			t.dueBy(expiry)
		}
		if again, _ := t.leafWord(i, st, -1, false); again == w {
			t.up(i)
			return
		}
	}
}

// up recomputes the nodes above leaf i, stopping at one that does not
// change (whoever changed it goes on up).
func (t *activeTree) up(i int) {
	for lv := 1; lv < len(t.levels); lv++ {
		i /= fan
		node := &t.levels[lv][i]
		kids := t.levels[lv-1][i*fan : i*fan+fan]
		for {
			w := combine(kids)
			if node.Load() == w {
				return
			}
			node.Store(w)
			if combine(kids) == w {
				break
			}
		}
	}
}

// dueBy brings the next resync forward to at.
func (t *activeTree) dueBy(at int64) {
	for {
		d := t.due.Load()
		if d <= at || t.due.CompareAndSwap(d, at) {
			return
		}
	}
}

// resync recomputes every leaf with the breakers' blackouts and the
// active-count decay at now, then every node, and sets the next due time.
// A pick that finds another resync running goes on with the tree as is.
func (t *activeTree) resync(now int64) {
	if !t.syncMu.TryLock() {
		return
	}
	defer t.syncMu.Unlock()
	// The next due time first: a breaker tripping during the resync
	// brings it forward (dueBy) and must not be overwritten.
	t.due.Store(now + max(int64(t.shared.activeTimeout)/activeResyncDivisor, 1))
	leaves := t.levels[0]
	for i, s := range t.servers {
		st := s.inst.view()
		for {
			w, expiry := t.leafWord(i, st, now, true)
			if expiry != 0 {
				t.dueBy(expiry)
			}
			if leaves[i].Load() == w {
				break
			}
			leaves[i].Store(w)
			// Checked as the hooks check theirs: a request that started or
			// ended meanwhile is not overwritten by the value read before.
			if again, _ := t.leafWord(i, st, now, true); again == w {
				break
			}
		}
	}
	t.rebuildNodes()
}

// rebuildNodes recomputes every node bottom up, each checked as up does.
func (t *activeTree) rebuildNodes() {
	for lv := 1; lv < len(t.levels); lv++ {
		kids := t.levels[lv-1]
		for i := range len(kids) / fan { // the padding above stays absent
			node := &t.levels[lv][i]
			group := kids[i*fan : i*fan+fan]
			for {
				w := combine(group)
				node.Store(w)
				if combine(group) == w {
					break
				}
			}
		}
	}
}

// newActiveTree builds the tree of v's servers at now, registers it with
// their statistics (unless they already watch a newer snapshot's tree),
// and only then reads them, so that no change is missed in between.
func newActiveTree(v *View, shared *statsShared, now int64) *activeTree {
	t := &activeTree{servers: v.servers, shared: shared}
	if v.wt != nil {
		t.weights = make([]uint32, len(v.servers))
		for i := range v.servers {
			t.weights[i] = uint32(v.wt.weight(i))
		}
		t.scale = v.wt.scale
	}
	if v.snap != nil {
		t.version = v.snap.version
	}
	n := max(len(v.servers), 1)
	size := (n + fan - 1) / fan * fan
	for {
		lv := make([]atomic.Uint64, size)
		for i := range lv {
			lv[i].Store(absentWord)
		}
		t.levels = append(t.levels, lv)
		if size == 1 {
			break
		}
		size = (size + fan - 1) / fan
		if size > 1 {
			size = (size + fan - 1) / fan * fan
		}
	}
	if v.snap != nil {
		t.watch()
	}
	t.due.Store(now) // the first pick resyncs: leaves, nodes, due time
	t.resync(now)
	return t
}

// watch points the servers' statistics at this tree. A server watches the
// trees of one snapshot (and of its subsets, which share its version):
// those of a newer snapshot replace them. The watches and their leaves are
// allocated in two blocks, the leaves' sized by a first pass; a server
// watched by more trees meanwhile gets leaves of its own.
func (t *activeTree) watch() {
	ws := make([]activeWatch, len(t.servers))
	size := 0
	for _, s := range t.servers {
		// Every watched server needs statistics of its own: a change of
		// its active count must reach the tree.
		size += len(t.kept(s.inst.own().watch.Load())) + 1
	}
	block := make([]treeLeaf, 0, size)
	for i, s := range t.servers {
		st := s.inst.own()
		nw := &ws[i]
		for {
			old := st.watch.Load()
			if old != nil && old.version > t.version {
				break // a newer snapshot's tree already watches it
			}
			kept := t.kept(old)
			n := len(kept) + 1
			var leaves []treeLeaf
			if free := len(block); cap(block)-free >= n {
				leaves, block = block[free:free:free+n], block[:free+n]
			} else {
				leaves = make([]treeLeaf, 0, n)
			}
			*nw = activeWatch{version: t.version, leaves: append(append(leaves, kept...), treeLeaf{t, int32(i)})}
			if st.watch.CompareAndSwap(old, nw) {
				break
			}
		}
	}
}

// kept returns the leaves of w that a watch for t keeps: those of t's
// snapshot, none of an older one.
func (t *activeTree) kept(w *activeWatch) []treeLeaf {
	if w != nil && w.version == t.version {
		return w.leaves
	}
	return nil
}

// least returns one of the servers with the fewest active requests whose
// breaker is closed, uniformly among them, or nil when every server is
// tripped.
func (t *activeTree) least(p *PickInfo) *Server {
	now := p.nanotime()
	if now >= t.due.Load() {
		t.resync(now)
	}
	root := t.levels[len(t.levels)-1][0].Load()
	key := root >> keyBits
	if key >= trippedKey {
		return nil
	}
	r := uint64(0)
	if c := root & countMask; c > 1 {
		r = uint64(p.Rand().IntN(int(c)))
	}
	i := 0
	for lv := len(t.levels) - 2; lv >= 0; lv-- {
		base := i * fan
		kids := t.levels[lv][base : base+fan : base+fan]
		next := -1
		// The r-th leaf with the node's key, counting through the children
		// that have it.
		for j := range kids {
			w := kids[j].Load()
			if w>>keyBits != key {
				continue
			}
			if c := w & countMask; r < c {
				next = j
				break
			} else {
				r -= c
			}
		}
		if next < 0 {
			// The node changed under us (a request started or ended): go on
			// below it with its children's own least key.
			if key, r, next = reseat(kids, r); next < 0 {
				return nil
			}
		}
		i = base + next
	}
	if i >= len(t.servers) {
		return nil
	}
	return t.servers[i]
}

// reseat picks among kids by their own least key when their parent's key
// or count was stale, keeping r within their count.
func reseat(kids []atomic.Uint64, r uint64) (key, rest uint64, next int) {
	var words [fan]uint64
	best, total := uint64(absentKey), uint64(0)
	for j := range kids {
		w := kids[j].Load()
		words[j] = w
		switch k := w >> keyBits; {
		case k < best:
			best, total = k, w&countMask
		case k == best:
			total += w & countMask
		}
	}
	if best >= trippedKey || total == 0 {
		return best, 0, -1
	}
	r %= total
	for j, w := range words {
		if w>>keyBits != best {
			continue
		}
		if c := w & countMask; r < c {
			return best, r, j
		} else {
			r -= c
		}
	}
	return best, 0, -1
}

// activeTreeOf returns v's tree, building it if the snapshot's preparation
// did not (a zone's view, or a view of a snapshot built before).
func (r *BestAvailable) activeTreeOf(p *PickInfo) *activeTree {
	v := p.View
	if t := v.least.Load(); t != nil {
		return t
	}
	if p.b == nil {
		return nil // a hand-made PickInfo: no statistics to share
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := v.least.Load(); t != nil {
		return t
	}
	t := newActiveTree(v, p.b.shared, p.nanotime())
	v.least.Store(t)
	return t
}
