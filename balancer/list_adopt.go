package balancer

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// adoption turns one list into the balancer's servers: it finds each
// one's listed server, keeps the servers in the caller's order with their
// positions, and gathers the errors. adopt and adoptShared share it.
// Called with b.mu held.
type adoption struct {
	b    *Balancer
	prev []*Server // the current list
	list []*Server
	from []int // list[i] is the caller's server at from[i]
	errs []indexedError
}

func (b *Balancer) newAdoption(n int) adoption {
	return adoption{b: b, prev: b.snap.Load().all, list: make([]*Server, 0, n), from: make([]int, 0, n)}
}

// listed returns the listed server with this ID, or nil. A list mostly
// comes in the order of the one before: the server at the same position
// is the likely one, then a search.
func (a *adoption) listed(id string) *Server {
	if j := len(a.list); j < len(a.prev) && a.prev[j].ID == id {
		return a.prev[j]
	}
	return a.b.byID.find(id)
}

// keep lists s, the caller's server at position i.
func (a *adoption) keep(s *Server, i int) {
	a.list = append(a.list, s)
	a.from = append(a.from, i)
}

// fail records the error of the caller's server at position i.
func (a *adoption) fail(i int, err error) { a.errs = append(a.errs, indexedError{i, err}) }

// take lists s, new or changed, as the balancer's own: its derived fields
// set, and the statistics of old (the listed server of its ID, nil for
// none) kept.
func (a *adoption) take(s, old *Server, i int) {
	s.zone = zoneNameOf(s.Zone)
	if old != nil {
		s.inst = old.inst // same instance, new details: keep its stats
	} else {
		s.inst = newInstance(a.b.shared)
	}
	a.keep(s, i)
}

// done indexes the list by ID and returns it with the errors.
func (a *adoption) done() ([]*Server, serverIndex, error) {
	list, byID, dups := indexByID(a.list, a.from)
	return list, byID, joinInOrder(append(a.errs, dups...))
}

// adopt turns caller values into the balancer's *Server copies, reusing the
// current copy of an unchanged server, and indexes them by ID. Called with
// b.mu held.
func (b *Balancer) adopt(servers []Server) ([]*Server, serverIndex, error) {
	a := b.newAdoption(len(servers))
	var metadata metadataCopies
	for i := range servers {
		s := servers[i]
		// A copy of one of our servers carries derived fields: drop them,
		// the caller may have changed what they derive from.
		s.inst, s.zone = nil, zoneName{}
		if err := s.normalize(); err != nil {
			a.fail(i, err)
			continue
		}
		if b.loc.excludes(s.Region) {
			continue // another region's, under LocalRegionOnly
		}
		old := a.listed(s.ID)
		if old != nil && old.sameAs(&s) {
			a.keep(old, i)
			continue
		}
		// A fresh copy only for new or changed servers: taking &s would
		// move every loop's s to the heap.
		ns := new(Server)
		*ns = s
		ns.Metadata = metadata.copyOf(s.Metadata)
		a.take(ns, old, i)
	}
	return a.done()
}

// adoptShared is adopt for SetServersShared: the servers become the
// balancer's copies themselves. Called with b.mu held.
func (b *Balancer) adoptShared(servers []*Server) ([]*Server, serverIndex, error) {
	a := b.newAdoption(len(servers))
	for i, s := range servers {
		if s == nil {
			a.fail(i, fmt.Errorf("balancer: server %d: nil", i))
			continue
		}
		old := a.listed(s.ID)
		if s.inst != nil {
			if s == old {
				a.keep(s, i) // listed now: kept as it is
				continue
			}
			// Another balancer's, or one this balancer listed before
			// and whose state (statistics, alive) older snapshots may
			// still read: a copy of our own, as SetServers makes.
			c := *s
			c.inst, c.zone = nil, zoneName{}
			s = &c
		}
		if err := s.normalize(); err != nil {
			a.fail(i, err)
			continue
		}
		if b.loc.excludes(s.Region) {
			continue
		}
		if old != nil && old.sameAs(s) {
			// An equal server changes nothing, as in SetServers. (A
			// caller that keeps its servers, as the mirror does, gives
			// the same one again: old is s, kept above.)
			a.keep(old, i)
			continue
		}
		a.take(s, old, i)
	}
	return a.done()
}

// serverIndex is a list of servers sorted by ID, searched by binary
// search: 8 bytes a server, where a map by ID took about 33 (docs/perf/memory.md,
// "What keeps it down").
type serverIndex []*Server

func compareID(s *Server, id string) int { return strings.Compare(s.ID, id) }

// find returns the server with this ID, or nil.
func (x serverIndex) find(id string) *Server {
	if i, ok := slices.BinarySearchFunc(x, id, compareID); ok {
		return x[i]
	}
	return nil
}

// indexByID indexes list by ID, from[i] being the position in the
// caller's list of list[i]. Of servers with one ID the first is kept:
// it returns the list without the others, the index, and an error for
// each server left out, at its position in the caller's list.
func indexByID(list []*Server, from []int) ([]*Server, serverIndex, []indexedError) {
	byID := func(a, b *Server) int { return strings.Compare(a.ID, b.ID) }
	// A list in ID order (a registry's, as lbvisitor gives it) is its own
	// index, 8 bytes a server less: neither is ever written once built.
	index := list
	if !slices.IsSortedFunc(list, byID) {
		index = slices.Clone(list)
		// Stable: of equal IDs, the first of the list comes first.
		slices.SortStableFunc(index, byID)
	}
	dup := false
	for i := 1; i < len(index); i++ {
		if index[i].ID == index[i-1].ID {
			dup = true
			break
		}
	}
	if !dup {
		return list, index, nil
	}
	// Duplicates are rare: find them again by position, as the same
	// *Server may stand at two positions.
	var errs []indexedError
	seen := make(map[string]bool, len(list))
	kept := list[:0:0]
	for i, s := range list {
		if seen[s.ID] {
			errs = append(errs, indexedError{from[i], fmt.Errorf("balancer: server %q: duplicate ID, first kept", s.ID)})
			continue
		}
		seen[s.ID] = true
		kept = append(kept, s)
	}
	if sameArray(index, list) {
		index = slices.Clone(index) // compacted below: the caller's list stays as it is
	}
	return kept, slices.CompactFunc(index, func(a, b *Server) bool { return a.ID == b.ID }), errs
}

// indexedError is an error about the server at position at of a list.
type indexedError struct {
	at  int
	err error
}

// joinInOrder joins errs in the order of their positions.
func joinInOrder(errs []indexedError) error {
	if len(errs) == 0 {
		return nil
	}
	slices.SortStableFunc(errs, func(a, b indexedError) int { return a.at - b.at })
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e.err
	}
	return errors.Join(out...)
}

// metadataCopies makes the balancer's copies of its servers' metadata,
// one copy shared by the servers whose metadata are equal: the instances
// of a service mostly carry the same labels (a version, a team), and a
// copy per server was the largest part of a balancer's memory at 100,000
// servers (docs/perf/memory.md, "Where the memory goes"). The copies are never modified.
// It remembers the last few distinct maps it copied, which catches runs
// of equal maps in a list; the zero value is ready to use.
type metadataCopies struct {
	recent [4]map[string]string
	next   int
}

func (c *metadataCopies) copyOf(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	for _, r := range c.recent {
		if r != nil && maps.Equal(r, m) {
			return r
		}
	}
	out := maps.Clone(m)
	c.recent[c.next] = out
	c.next = (c.next + 1) % len(c.recent)
	return out
}
