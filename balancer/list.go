package balancer

import (
	"fmt"
	"slices"
)

// SetServers replaces the list. Servers are identified by ID (host:port
// when empty); the first of duplicate IDs wins. Invalid entries are left out
// and reported in the returned error; if every entry of a non-empty list is
// invalid, the current list is kept. Under Config.LocalRegionOnly the
// servers of other regions are left out without error (a list of them
// alone empties it). An equal list changes nothing. Stats of servers that
// stay are kept; servers new to the list start alive.
func (b *Balancer) SetServers(servers []Server) error {
	return b.replace(func() ([]*Server, serverIndex, error) { return b.adopt(servers) })
}

// replace installs the list adopt makes under b.mu, unless adopt found no
// valid server and an error: then the list is kept.
func (b *Balancer) replace(adopt func() ([]*Server, serverIndex, error)) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	list, byID, err := adopt()
	if len(list) == 0 && err != nil {
		b.mu.Unlock()
		return fmt.Errorf("balancer %q: no valid server, list kept: %w", b.name, err)
	}
	b.installLocked(list, byID)
	b.mu.Unlock()
	b.notify()
	return err
}

// SetServersShared is SetServers for servers the caller built for this
// balancer and never modifies: the balancer keeps each as its copy
// instead of copying it, and fills in its unexported fields. The caller
// may go on reading their exported fields, as a registry's copy does that
// hands the balancer the servers it holds (lbvisitor, from the mirror):
// one copy of each instance instead of two. A server this balancer lists
// is kept as it is, and so is a listed one equal to a server given (an
// equal list changes nothing); one that another balancer holds, or that
// this one listed before, is copied, as SetServers copies. A server must
// not be given to two balancers at once.
func (b *Balancer) SetServersShared(servers []*Server) error {
	return b.replace(func() ([]*Server, serverIndex, error) { return b.adoptShared(servers) })
}

// AddServers adds servers to the list; a server with an ID already listed
// replaces it in place.
func (b *Balancer) AddServers(servers ...Server) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	cur := b.snap.Load().all
	merged := make([]Server, 0, len(cur)+len(servers))
	for _, s := range cur {
		merged = append(merged, *s)
	}
	merged = append(merged, servers...)
	// Later entries replace earlier ones with the same ID, in place.
	list, byID, err := b.adopt(dedupeLastWins(merged))
	b.installLocked(list, byID)
	b.mu.Unlock()
	b.notify()
	return err
}

func dedupeLastWins(in []Server) []Server {
	key := func(s *Server) string {
		if s.ID == "" && s.Host != "" {
			return s.Addr() // the ID SetServers will give it
		}
		return s.ID
	}
	last := make(map[string]int, len(in))
	for i := range in {
		last[key(&in[i])] = i
	}
	out := make([]Server, 0, len(last))
	for i := range in {
		k := key(&in[i])
		if j, ok := last[k]; ok {
			out = append(out, in[j]) // at the first position, with the last value
			delete(last, k)
		}
	}
	return out
}

// installLocked swaps in a snapshot of list if it differs from the current
// one and queues the change for listeners. Called with b.mu held.
func (b *Balancer) installLocked(list []*Server, byID serverIndex) {
	old := b.snap.Load()
	if slices.Equal(old.all, list) {
		return
	}
	b.byID = byID
	if b.slow != nil {
		b.slow.noteList(old.all, list, b.shared.nanotime())
	}
	b.swapLocked(list)
	b.nmu.Lock()
	b.pending = append(b.pending, change{old: old.all, new: list})
	b.nmu.Unlock()
	if b.pingLoop != nil {
		b.pingLoop.kick()
	}
}

// swapLocked installs a new snapshot of list. Called with b.mu held.
func (b *Balancer) swapLocked(list []*Server) {
	b.version++
	r := b.slow.rampAt(list, b.shared)
	snap := buildSnapshot(b.version, list, r)
	snap.tiers = b.loc.tiersOf(snap, r)
	prepareRule(b, b.rule, snap) // BestAvailable's and Maglev's indexes (rules.go)
	// The zone decision is made with the snapshot (zone.go). A breaker
	// change while it was made, or a refresh of the old snapshot's, is
	// redone over the new one.
	epoch := b.shared.epoch.Load()
	b.shared.zonesPending.Store(false)
	d := b.decideZones(snap, b.shared.nanotime())
	snap.decision.Store(d)
	old := b.snap.Swap(snap)
	b.syncDecision()
	b.recheckIfLoadChanged()
	b.notePanic(d)
	close(old.replaced)
	if b.zonesRefreshing.Load() || b.shared.epoch.Load() != epoch {
		b.refreshZones()
	} else {
		b.shared.zonesDue.Store(d.due)
	}
}

// syncDecision sets b.decision to the current snapshot's decision. Every
// writer of either calls it after its write, and it returns only once it
// saw them agree, so the last writer leaves them agreeing. A writer that
// read an older state fails its swap: every decision is a new object, so
// the value it read before that state cannot be the current one again.
// Between a write and its sync, a pick may use the decision before it, as
// a pick that loaded the snapshot just before the write does.
func (b *Balancer) syncDecision() {
	for {
		cur := b.decision.Load()
		want := b.snap.Load().decision.Load()
		if cur == want {
			return
		}
		b.decision.CompareAndSwap(cur, want)
	}
}

// markLoadChanged tells the balancer's current decision that an active
// count changed after it was made (statsShared.loadChanged, once
// zonesPending is set), so that a Choose reads the clock to see whether
// it is due.
func (b *Balancer) markLoadChanged() {
	if d := b.decision.Load(); d != nil { // nil only while New runs
		d.recheck.Or(recheckLoad)
	}
}

// recheckIfLoadChanged is called after a new decision is installed: if an
// active count changed since zonesPending was cleared for it, the count's
// markLoadChanged may have marked the decision before (its load of
// b.decision came first), so the current one is marked here. zonesPending
// is set before its decision is marked, and cleared before a decision is
// made: either this load sees it set, or the mark comes after the new
// decision is installed and lands on it.
func (b *Balancer) recheckIfLoadChanged() {
	if b.shared.zonesPending.Load() {
		b.markLoadChanged()
	}
}

// MarkServerDown takes a server out of the reachable list until it is
// marked up, a ping finds it alive, or it leaves the list and comes back.
// It reports whether the server is listed.
func (b *Balancer) MarkServerDown(id string) bool { return b.setAlive(map[string]bool{id: false}) }

// MarkServerUp returns a server marked down to the reachable list. It
// reports whether the server is listed.
func (b *Balancer) MarkServerUp(id string) bool { return b.setAlive(map[string]bool{id: true}) }

// MarkServers marks several servers up (true) or down (false) at once,
// with one new snapshot: for an adapter that follows connection states
// (the gRPC balancer marks down the endpoints that are not READY). It
// reports whether any of the IDs is listed; unknown IDs are ignored.
func (b *Balancer) MarkServers(alive map[string]bool) bool { return b.setAlive(alive) }

// setAlive applies liveness results and rebuilds the snapshot if any
// changed. It reports whether any of the IDs is listed.
func (b *Balancer) setAlive(alive map[string]bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	found, changed := false, false
	for id, up := range alive {
		srv := b.byID.find(id)
		if srv == nil {
			continue
		}
		inst := srv.inst
		found = true
		if inst.alive.Swap(up) != up {
			changed = true
		}
	}
	if changed {
		b.swapLocked(b.snap.Load().all)
	}
	return found
}
