package serverlist

// The mirror's index of records by the NATS connection that holds them
// (Instance.NATSServerID, NATSClientID), for the gateways' crash detection
// by client-disconnect advisories: an advisory names a connection, and the
// index says which records, if any, it held. The watch loop keeps it
// current through the apply path (mirror_apply.go).

import (
	"maps"
	"slices"
	"sync"
)

// connIndex maps connections to the instances whose records name them. A
// record names one connection; a connection may hold several records (a
// process that announces several instances over one connection).
//
// Threading: the mirror's goroutine writes it (update, rebuild, intern);
// readers (ByConnection) take the read lock. intern's map is the mirror
// goroutine's alone.
type connIndex struct {
	mu sync.RWMutex
	m  map[Connection][]instanceKey

	// servers interns server IDs: a fleet's records name a handful of
	// servers, each ID 56 bytes, so a mirror of 100,000 instances keeps one
	// copy of each instead of one per record.
	servers map[string]string
}

// instanceKey names one instance.
type instanceKey struct{ service, id string }

// intern returns the interned copy of a server ID. Only the mirror's
// goroutine calls it.
func (x *connIndex) intern(serverID string) string {
	if serverID == "" {
		return ""
	}
	if s, ok := x.servers[serverID]; ok {
		return s
	}
	if x.servers == nil {
		x.servers = make(map[string]string)
	}
	x.servers[serverID] = serverID
	return serverID
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
		keys := slices.DeleteFunc(slices.Clone(x.m[old]), func(o instanceKey) bool { return o == k })
		if len(keys) == 0 {
			delete(x.m, old)
		} else {
			x.m[old] = keys
		}
	}
	if !cur.IsZero() {
		if x.m == nil {
			x.m = make(map[Connection][]instanceKey)
		}
		x.m[cur] = append(slices.Clone(x.m[cur]), k)
	}
}

// rebuild replaces the index with the connections of a freshly synced
// copy, and forgets the server IDs none of its records names.
func (x *connIndex) rebuild(fresh map[string]map[string]*mirrorEntry) {
	m := make(map[Connection][]instanceKey)
	servers := make(map[string]string)
	for service, ids := range fresh {
		for id, e := range ids {
			if c := e.connection(); !c.IsZero() {
				m[c] = append(m[c], instanceKey{service, id})
				servers[c.ServerID] = c.ServerID
			}
		}
	}
	x.servers = servers
	x.mu.Lock()
	x.m = m
	x.mu.Unlock()
}

// keys returns the instances indexed under c.
func (x *connIndex) keys(c Connection) []instanceKey {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.m[c]
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

// connections returns a copy of the index, for tests.
func (x *connIndex) connections() map[Connection][]instanceKey {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return maps.Clone(x.m)
}
