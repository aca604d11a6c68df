package serverlist

// The mirror's apply path: decoding a watched entry, telling a lease
// refresh (the same bytes again) from a change without decoding, the
// copy-on-write update of the index (mirror_index.go) and the swap of a
// freshly synced copy, with the OnChange and OnRefresh calls each makes.
// Only the mirror's goroutine (mirror.go) runs it.

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
)

// entryChange decodes e into the change it makes: the instance to store, or
// a removal. ok is false for a malformed entry, which is counted and logged.
// regional tells a copy of another region's record (IsRegionalKey).
func (m *Mirror) entryChange(e jetstream.KeyValueEntry) (c change, ok bool) {
	service, id, regional, err := decodeKey(e.Key())
	if err != nil {
		m.malformedKeys.Add(1)
		m.log.Warn().Err(err).Str("key", e.Key()).Msg("serverlist: skipping registry entry with malformed key")
		return change{}, false
	}
	c = change{service: service, id: id, regional: regional}
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		m.removals.Add(1)
		c.remove = true
		return c, true
	}
	in, err := decodeValueShared(service, id, e.Value(), &m.shared)
	if err == nil && regional && (in.Region == "" || !strings.HasSuffix(id, "@"+in.Region)) {
		err = fmt.Errorf("%w: %s/%s: a copy of region %q's record", ErrInvalidInstance, service, id, in.Region)
	}
	if err != nil {
		m.malformedValues.Add(1)
		m.log.Warn().Err(err).Str("key", e.Key()).Msg("serverlist: skipping malformed registry entry")
		return change{}, false
	}
	if !in.Routable() {
		// Marked down (its health check fails): as absent to the mirror,
		// so that no list holds it, until a record that serves again.
		m.removals.Add(1)
		c.remove = true
		return c, true
	}
	m.puts.Add(1)
	c.in = in
	return c, true
}

// change is what entryChange decoded of an entry.
type change struct {
	service, id string
	in          Instance // the instance to store, unless remove
	remove      bool
	regional    bool // the key of another region's record (IsRegionalKey)
}

// displaces reports whether c may change the entry held for its ID (nil:
// none). A region's own record and another region's copy can share an ID
// (an own ID "x@eu", eu's "x" copied): the own record wins. A copy never
// replaces or removes it, and is counted as a collision when it would; an
// own key's removal leaves a copy alone.
func (m *Mirror) displaces(c change, held *mirrorEntry) bool {
	if held == nil || held.rec.regional() == c.regional {
		return true
	}
	if c.regional && !c.remove {
		m.collisions.Add(1)
		m.log.Warn().Str("service", c.service).Str("id", c.id).
			Msg("serverlist: another region's copy has the ID of this region's own record; the own record is kept")
	}
	return !c.regional && !c.remove
}

// applyFresh applies an initial value to the copy being built.
func (m *Mirror) applyFresh(fresh map[string]map[string]*mirrorEntry, skipped map[string]struct{}, e jetstream.KeyValueEntry, rev uint64) {
	c, ok := m.entryChange(e)
	setSkipped(skipped, e.Key(), skippedBy(e, c.remove, ok, func(service, id string) bool {
		_, held := fresh[service][id]
		return held
	}))
	if !ok || !m.displaces(c, fresh[c.service][c.id]) {
		return
	}
	if c.remove {
		delete(fresh[c.service], c.id)
		if len(fresh[c.service]) == 0 {
			delete(fresh, c.service)
		}
		return
	}
	ids := fresh[c.service]
	if ids == nil {
		// Named by a copy: the key's name is part of a whole message's
		// subject.
		ids = make(map[string]*mirrorEntry)
		fresh[strings.Clone(c.service)] = ids
	}
	ids[c.id] = m.compact(c.in, c.id, m.valueSum(e.Value()), rev, c.regional, m.heldEntry(c.service, c.id))
}

// apply applies a live entry at (mirror) revision rev and calls OnChange or
// OnRefresh for it. Only the mirror's goroutine calls it, so it needs no lock
// to copy and store.
//
// A lease refresh re-puts the bytes already stored: it is found by its key
// and the bytes' sum (valueSum), without decoding the value or allocating,
// since it arrives for every instance every lease period. Anything else is decoded
// and validated.
//
// sw is the watch the entry came from (nil in tests): the service's
// revision (ServiceRevision) is noted before OnChange, so that a subscriber
// which reconciles the service on its OnChange reads it.
func (m *Mirror) apply(e jetstream.KeyValueEntry, rev uint64, sw *scopeWatch) {
	if svc, old := m.sameBytes(e); old != nil {
		m.puts.Add(1)
		m.refresh(svc.name, old, rev)
		return
	}
	c, ok := m.entryChange(e)
	service, id, in, remove := c.service, c.id, c.in, c.remove
	skip := skippedBy(e, remove, ok, func(service, id string) bool {
		return m.state.Load().instances(service).find(id) != nil
	})
	m.skippedMu.Lock()
	setSkipped(m.skipped, e.Key(), skip)
	m.skippedMu.Unlock()
	if !ok {
		return
	}
	cur := m.state.Load()
	svc := cur.services[service]
	var ids instanceList
	if svc != nil {
		ids = *svc.ids.Load()
	}
	old := ids.find(id)
	if !m.displaces(c, old) {
		return
	}
	had := old != nil
	switch {
	case remove && !had:
		return
	case !remove && had && old.holds(in):
		// The same instance in other bytes (a publisher that encodes
		// differently, another field order): a refresh. Keep these bytes
		// so that the next refresh takes the cheap path.
		old.sum = m.valueSum(e.Value())
		m.refresh(svc.name, old, rev)
		return
	}
	var next instanceList
	var oldConn, curConn connKey
	if had {
		oldConn = old.connKey()
	}
	if remove {
		next = ids.without(id)
		m.instances.Add(-1)
	} else {
		ne := m.compact(in, id, m.valueSum(e.Value()), rev, c.regional, old)
		curConn = ne.connKey()
		next = ids.with(ne)
		if !had {
			m.instances.Add(1)
		}
	}
	switch {
	case svc != nil && len(next) > 0:
		svc.ids.Store(&next)
	case svc == nil:
		// A new service: a new view of the services. Its name is copied
		// out of the entry's key, which holds a whole message's subject.
		services := maps.Clone(cur.services)
		if services == nil {
			services = make(map[string]*mirrorService, 1)
		}
		svc = newMirrorService(strings.Clone(service), next)
		services[svc.name] = svc
		m.state.Store(&mirrorState{services: services})
	default:
		// The service's last instance went.
		services := maps.Clone(cur.services)
		delete(services, service)
		m.state.Store(&mirrorState{services: services})
	}
	// After the state: a reader that finds the instance through the index
	// finds its record (ByConnection checks it).
	m.conns.update(svc.name, id, oldConn, curConn)
	m.noteServiceRevision(sw, e.Key(), rev)
	if m.cfg.OnChange != nil {
		m.cfg.OnChange(svc.name)
	}
}

// noteServiceRevision records rev as the revision of the last entry of
// the service of key, as the watch sw sees it (ServiceRevision). A nil sw
// notes nothing.
func (m *Mirror) noteServiceRevision(sw *scopeWatch, key string, rev uint64) {
	switch {
	case sw == nil:
	case sw.service == "":
		m.serviceRevs.note(serviceOfKey(key), rev)
	default:
		sw.applied(rev)
	}
}

// refresh records a put that left old's instance as it was: a new revision,
// nothing else. The entry's revision is the one mutable field of the state,
// so a refresh copies nothing.
func (m *Mirror) refresh(service string, old *mirrorEntry, rev uint64) {
	old.rev.Store(rev)
	m.refreshes.Add(1)
	if m.cfg.OnRefresh != nil {
		m.cfg.OnRefresh(service, old.rec.srv.ID, old.rec.srv.Incarnation, rev)
	}
}

// maxEncodedID is the length of the longest key part EncodeKey makes of an
// instance ID: unpadded base64 of events.MaxInstanceIDLength bytes.
const maxEncodedID = (events.MaxInstanceIDLength*8 + 5) / 6

// sameBytes returns the entry that e refreshes: a put whose key the mirror
// holds, with the very bytes stored (their sum, see valueSum). It returns nil for anything else (a
// change, a removal, a new or malformed key), which the full path then
// decodes, validates and counts. It does not allocate: the key's ID is
// decoded on the stack, and a map read with string(bytes) copies nothing.
// A key accepted here is canonical (see DecodeKey), so it is the key of
// the entry found, which was validated when stored.
func (m *Mirror) sameBytes(e jetstream.KeyValueEntry) (*mirrorService, *mirrorEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		return nil, nil
	}
	service, enc, ok := strings.Cut(e.Key(), ".")
	if !ok || len(enc) > maxEncodedID {
		return nil, nil
	}
	svc := m.state.Load().services[service]
	if svc == nil {
		return nil, nil
	}
	var buf [events.MaxInstanceIDLength]byte
	n, err := keyEncoding.Decode(buf[:], []byte(enc))
	if err != nil || keyEncoding.EncodedLen(n) != len(enc) {
		return nil, nil
	}
	old := svc.ids.Load().findBytes(buf[:n])
	if old == nil || old.sum != m.valueSum(e.Value()) {
		return nil, nil
	}
	return svc, old
}

// swap installs a freshly synced copy, whose last entry has revision rev,
// and reports the services that differ from the previous one through
// OnChange.
func (m *Mirror) swap(fresh map[string]map[string]*mirrorEntry, rev uint64) {
	count := 0
	services := make(map[string]*mirrorService, len(fresh))
	for service, ids := range fresh {
		count += len(ids)
		services[service] = newMirrorService(service, listOf(ids))
	}
	old := m.state.Swap(&mirrorState{services: services})
	m.conns.rebuild(fresh)
	m.instances.Store(int64(count))
	m.syncs.Add(1)

	// Published after the OnChange calls, as in watch.
	defer m.advanceRevision(rev)
	if m.cfg.OnChange == nil {
		return
	}
	var changed []string
	for service, ids := range fresh {
		if m.resynced(service, ids, old.instances(service)) {
			changed = append(changed, service)
		}
	}
	for service := range old.services {
		if _, ok := fresh[service]; !ok {
			changed = append(changed, service)
		}
	}
	slices.Sort(changed)
	for _, service := range changed {
		m.cfg.OnChange(service)
	}
}

// resynced reports whether a service's freshly synced entries (ids)
// differ from its list before; when they do not, it calls OnRefresh for
// the entries at newer revisions (refreshes while the watch was down, or a
// re-registration into a recreated bucket). The caller calls OnChange.
func (m *Mirror) resynced(service string, ids map[string]*mirrorEntry, before instanceList) (changed bool) {
	if !sameInstances(ids, before) {
		return true
	}
	if m.cfg.OnRefresh != nil {
		for id, e := range ids {
			if r := e.rev.Load(); r > before.find(id).rev.Load() {
				m.cfg.OnRefresh(service, id, e.rec.srv.Incarnation, r)
			}
		}
	}
	return false
}

// skippedBy reports whether the index leaves out the record of e's key
// after e, a change that entryChange decoded: ok false for a malformed
// entry, remove for a removal. A malformed key is left out; a malformed
// value only when the index holds no earlier good value of the key
// (held reports whether it does); a record marked down is left out.
func skippedBy(e jetstream.KeyValueEntry, remove, ok bool, held func(service, id string) bool) bool {
	if !ok {
		service, id, err := DecodeKey(e.Key())
		return err != nil || !held(service, id)
	}
	return remove && e.Operation() == jetstream.KeyValuePut
}

// setSkipped adds key to skipped or removes it from it (see
// Mirror.skipped).
func setSkipped(skipped map[string]struct{}, key string, skip bool) {
	if _, had := skipped[key]; had == skip {
		return
	}
	if skip {
		skipped[strings.Clone(key)] = struct{}{} // not the message's subject
	} else {
		delete(skipped, key)
	}
}

// skippedKeys returns the keys of the records the bucket holds that the
// index leaves out (see Mirror.skipped).
func (m *Mirror) skippedKeys() []string {
	m.skippedMu.Lock()
	defer m.skippedMu.Unlock()
	return slices.Collect(maps.Keys(m.skipped))
}

// sameInstances reports whether a freshly synced service's entries (ids)
// hold the same instances as the list before.
func sameInstances(ids map[string]*mirrorEntry, before instanceList) bool {
	if len(ids) != len(before) {
		return false
	}
	for _, b := range before {
		if a, ok := ids[b.rec.srv.ID]; !ok || !sameInstance(a, b) {
			return false
		}
	}
	return true
}
