package serverlist

// The mirror's index of records by the NATS connection that holds them
// (Instance.NATSServerID, NATSClientID), for the gateways' crash detection
// by client-disconnect advisories: an advisory names a connection, and the
// index says which records, if any, it held. The watch loop keeps it
// current through the apply path (mirror_apply.go).

import (
	"slices"
	"sync"
)

// connIndex maps connections to the instances whose records name them. A
// record names one connection; a connection usually holds one record (a
// process announces its instance over its own connection), sometimes
// several (a process that announces several instances over one
// connection). The first case is kept without a slice of its own: one
// entry of a map of 100,000 costs 56 bytes there, against 48 and a 32-byte
// slice.
//
// Threading: the mirror's goroutine writes it (update, rebuild, intern);
// readers (ByConnection) take the read lock. intern's map is the mirror
// goroutine's alone.
type connIndex struct {
	mu sync.RWMutex
	// one holds the connections that hold one record, more those that
	// hold several (never fewer than two); a connection is in one map at
	// most. Slices in more are replaced, never modified.
	one  map[Connection]instanceKey
	more map[Connection][]instanceKey

	// servers interns server IDs: a fleet's records name a handful of
	// servers, each ID 56 bytes, so a mirror of 100,000 instances keeps one
	// copy of each instead of one per record, and each record a pointer
	// to it (8 bytes, where a string takes 16).
	servers map[string]*string
}

// instanceKey names one instance.
type instanceKey struct{ service, id string }

// intern returns the interned copy of a server ID, nil for none. Only the
// mirror's goroutine calls it.
func (x *connIndex) intern(serverID string) *string {
	if serverID == "" {
		return nil
	}
	if s, ok := x.servers[serverID]; ok {
		return s
	}
	if x.servers == nil {
		x.servers = make(map[string]*string)
	}
	s := &serverID
	x.servers[serverID] = s
	return s
}

// update moves service/id from the connection its record named (old) to
// the one it names now (cur); a zero Connection is none (a record without
// one, or removed).
func (x *connIndex) update(service, id string, old, cur Connection) {
	if old == cur {
		return
	}
	k := instanceKey{service, id}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !old.IsZero() {
		x.remove(old, k)
	}
	if !cur.IsZero() {
		x.add(cur, k)
	}
}

// add indexes k under c. The caller holds the write lock, or owns x.
func (x *connIndex) add(c Connection, k instanceKey) {
	if ks, ok := x.more[c]; ok {
		x.more[c] = append(slices.Clip(ks), k)
		return
	}
	first, ok := x.one[c]
	if !ok {
		if x.one == nil {
			x.one = make(map[Connection]instanceKey)
		}
		x.one[c] = k
		return
	}
	delete(x.one, c)
	if x.more == nil {
		x.more = make(map[Connection][]instanceKey)
	}
	x.more[c] = []instanceKey{first, k}
}

// remove drops k from under c. The caller holds the write lock.
func (x *connIndex) remove(c Connection, k instanceKey) {
	if first, ok := x.one[c]; ok {
		if first == k {
			delete(x.one, c)
		}
		return
	}
	ks := slices.DeleteFunc(slices.Clone(x.more[c]), func(o instanceKey) bool { return o == k })
	switch len(ks) {
	case 0:
		delete(x.more, c)
	case 1:
		delete(x.more, c)
		if x.one == nil {
			x.one = make(map[Connection]instanceKey)
		}
		x.one[c] = ks[0]
	default:
		x.more[c] = ks
	}
}

// rebuild replaces the index with the connections of a freshly synced
// copy, and forgets the server IDs none of its records names.
func (x *connIndex) rebuild(fresh map[string]map[string]*mirrorEntry) {
	next := connIndex{servers: make(map[string]*string)}
	for service, ids := range fresh {
		for id, e := range ids {
			if c := e.connection(); !c.IsZero() {
				next.add(c, instanceKey{service, id})
				if p := e.rec.extra().natsServer; p != nil {
					next.servers[c.ServerID] = p
				}
			}
		}
	}
	x.servers = next.servers
	x.mu.Lock()
	x.one, x.more = next.one, next.more
	x.mu.Unlock()
}

// keys returns the instances indexed under c.
func (x *connIndex) keys(c Connection) []instanceKey {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if k, ok := x.one[c]; ok {
		return []instanceKey{k}
	}
	return x.more[c]
}

// ByConnection returns the records the mirror holds that name the NATS
// connection c (Instance.NATSServerID and NATSClientID), with their
// revisions, sorted by service and instance ID: usually one, none for a
// connection that holds no record (a gateway's, a tool's, an instance's
// old connection after it reconnected and rewrote its record). A zero c
// names none.
func (m *Mirror) ByConnection(c Connection) []Entry {
	if c.IsZero() {
		return nil
	}
	var out []Entry
	for _, k := range m.conns.keys(c) {
		// The index and the state are updated one after the other: check
		// the record still names c.
		if e, ok := m.Entry(k.service, k.id); ok && e.Connection() == c {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return compareInstances(a.Instance, b.Instance) })
	return out
}
