package serverlist

// The mirror's index of records by the NATS connection that holds them
// (Instance.NATSServerID, NATSClientID), for the gateways' crash detection
// by client-disconnect advisories: an advisory names a connection, and the
// index says which records, if any, it held. The watch loop keeps it
// current through the apply path (mirror_apply.go).

import (
	"slices"
	"strings"
	"sync"
)

// connIndex maps connections to the instances whose records name them. A
// record names one connection; a connection usually holds one record (a
// process announces its instance over its own connection), sometimes
// several (a process that announces several instances over one
// connection). The first case is kept without a slice of its own: one
// entry of a map of 100,000 costs 40 bytes there, against 40 and a 24-byte
// slice.
//
// Threading: the mirror's goroutine writes it (update, rebuild, intern);
// readers (ByConnection) take the read lock. The mirror's goroutine reads
// servers without it (it is its only writer) and writes it under the
// write lock; services is the mirror goroutine's alone.
type connIndex struct {
	mu sync.RWMutex
	// one holds the connections that hold one record, more those that
	// hold several (never fewer than two); a connection is in one map at
	// most. Slices in more are replaced, never modified.
	one  map[connKey]instanceKey
	more map[connKey][]instanceKey

	// servers interns server IDs: a fleet's records name a handful of
	// servers, each ID 56 bytes, so a mirror of 100,000 instances keeps one
	// copy of each instead of one per record, and each record a pointer
	// to it (8 bytes, where a string takes 16). The maps above are keyed
	// by that pointer too (connKey).
	servers map[string]*string
	// services interns the names of the services the index holds
	// instances of, for the same reason (instanceKey). Like servers, it
	// forgets a name only in rebuild.
	services map[string]*string
}

// connKey is a Connection as the index keys it: its server ID's interned
// copy (one pointer per ID, see intern) instead of the ID, 16 bytes where
// a Connection takes 24; with its instanceKey, a map entry takes 40
// instead of 56 (at 100,000 connections, 6.0 MB where it took 8.0). The
// pointers of the records the index holds are those servers maps their
// IDs to: every record's comes from intern, and rebuild, which forgets
// IDs, keeps those of the records it indexes.
type connKey struct {
	server *string // nil for none
	client uint64
}

// isZero reports whether k names no connection (Connection.IsZero).
func (k connKey) isZero() bool { return k.server == nil || k.client == 0 }

// connKey is the key of the connection the entry's record names (zero for
// none).
func (e *mirrorEntry) connKey() connKey {
	x := e.rec.extra()
	return connKey{x.natsServer, x.natsClient}
}

// instanceKey names one instance: its service's name interned (service),
// 8 bytes where the name took 16, and its ID.
type instanceKey struct {
	service *string
	id      string
}

// service returns the interned copy of a service's name. The caller holds
// the write lock, or owns x.
func (x *connIndex) service(name string) *string {
	if s, ok := x.services[name]; ok {
		return s
	}
	if x.services == nil {
		x.services = make(map[string]*string)
	}
	s := strings.Clone(name) // its own bytes, not part of a key's
	x.services[s] = &s
	return &s
}

// intern returns the interned copy of a server ID, nil for none. Only the
// mirror's goroutine calls it.
func (x *connIndex) intern(serverID string) *string {
	if serverID == "" {
		return nil
	}
	if s, ok := x.servers[serverID]; ok {
		return s
	}
	s := new(string) // not &serverID, which would move it to the heap on every call
	*s = serverID
	x.mu.Lock() // readers look IDs up (keys)
	defer x.mu.Unlock()
	if x.servers == nil {
		x.servers = make(map[string]*string)
	}
	x.servers[serverID] = s
	return s
}

// update moves service/id from the connection its record named (old) to
// the one it names now (cur); a zero key is none (a record without one,
// or removed).
func (x *connIndex) update(service, id string, old, cur connKey) {
	if old == cur {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if s := x.services[service]; s != nil && !old.isZero() {
		x.remove(old, instanceKey{s, id})
	}
	if !cur.isZero() {
		x.add(cur, instanceKey{x.service(service), id})
	}
}

// add indexes k under c. The caller holds the write lock, or owns x.
func (x *connIndex) add(c connKey, k instanceKey) {
	if ks, ok := x.more[c]; ok {
		x.more[c] = append(slices.Clip(ks), k)
		return
	}
	first, ok := x.one[c]
	if !ok {
		if x.one == nil {
			x.one = make(map[connKey]instanceKey)
		}
		x.one[c] = k
		return
	}
	delete(x.one, c)
	if x.more == nil {
		x.more = make(map[connKey][]instanceKey)
	}
	x.more[c] = []instanceKey{first, k}
}

// remove drops k from under c. The caller holds the write lock.
func (x *connIndex) remove(c connKey, k instanceKey) {
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
			x.one = make(map[connKey]instanceKey)
		}
		x.one[c] = ks[0]
	default:
		x.more[c] = ks
	}
}

// rebuild replaces the index with the connections of a freshly synced
// copy, and forgets the server IDs and service names none of its records
// names.
func (x *connIndex) rebuild(fresh map[string]map[string]*mirrorEntry) {
	next := connIndex{servers: make(map[string]*string)}
	for service, ids := range fresh {
		for id, e := range ids {
			if c := e.connKey(); !c.isZero() {
				next.add(c, instanceKey{next.service(service), id})
				next.servers[*c.server] = c.server
			}
		}
	}
	x.mu.Lock()
	x.one, x.more, x.servers, x.services = next.one, next.more, next.servers, next.services
	x.mu.Unlock()
}

// keys returns the instances indexed under c.
func (x *connIndex) keys(c Connection) []instanceKey {
	x.mu.RLock()
	defer x.mu.RUnlock()
	server, ok := x.servers[c.ServerID]
	if !ok {
		return nil // no record names the server
	}
	k := connKey{server, c.ClientID}
	if ik, ok := x.one[k]; ok {
		return []instanceKey{ik}
	}
	return x.more[k]
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
		if e, ok := m.Entry(*k.service, k.id); ok && e.Connection() == c {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return compareInstances(a.Instance, b.Instance) })
	return out
}
