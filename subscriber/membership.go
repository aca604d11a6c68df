package subscriber

import (
	"slices"
	"time"
)

// outcome is what applying one observation did to the membership table.
type outcome int

const (
	applied   outcome = iota // the live set of the service changed
	unchanged                // accepted (e.g. a newer incarnation replacing a live one) without changing the live set
	duplicate                // already known
	stale                    // older than what is known
)

// member is what the table knows of one instance.
type member struct {
	incarnation int64
	// off says why the instance is offline in this incarnation; offNone
	// means it is live.
	off     offReason
	changed time.Time // when it last went online or offline; tombstones are collected by age
}

func (m *member) live() bool { return m.off == offNone }

// offReason records who took an instance offline, which decides who may
// bring it back within the same incarnation.
type offReason uint8

const (
	offNone      offReason = iota
	offAnnounced           // the instance announced offline: final for the incarnation
	offRegistry            // the registry lost it (deregistered, lease expired): the registry may bring it back
	offGossip              // gossip declared it dead: gossip may bring it back (a refuted suspicion)
)

// source tells where an observation comes from.
type source uint8

const (
	fromEvent source = iota
	fromRegistry
	fromGossip
)

// offBy is the reason an offline observation from src records.
func offBy(src source) offReason {
	switch src {
	case fromRegistry:
		return offRegistry
	case fromGossip:
		return offGossip
	}
	return offAnnounced
}

// membership is the table service -> instance ID -> member. It keeps
// tombstones (offline members) so that a late event of an old incarnation
// cannot bring an instance back. It is not safe for concurrent use: the
// Subscriber guards it with its mutex.
type membership struct {
	services map[string]map[string]*member
}

func newMembership() *membership {
	return &membership{services: make(map[string]map[string]*member)}
}

// apply records that instance id of service is online (or offline) in
// incarnation inc, as src observed it. The ordering rules:
//   - a lower incarnation than the one known is stale;
//   - a higher incarnation replaces what is known (a restart is a change
//     even when the instance stays live: its address may differ);
//   - within one incarnation an instance announces online once and
//     offline once, so an announced offline is final: nothing of the same
//     incarnation brings it back. An instance the registry lost comes
//     back only when the registry holds it again (its publisher re-put the
//     entry); one gossip declared dead, only when gossip sees it alive (a
//     refuted suspicion). An online event never revives: it is the
//     announcement the instance already made.
func (m *membership) apply(service, id string, inc int64, online bool, src source, now time.Time) outcome {
	ids := m.services[service]
	if ids == nil {
		ids = make(map[string]*member)
		m.services[service] = ids
	}
	cur := ids[id]
	switch {
	case online && src == fromGossip && (cur == nil || inc != cur.incarnation):
		// Gossip seeing a node alive only undoes its own suspicion: an
		// instance becomes live by announcing (or registering), which may
		// reach us after its gossip.
		return unchanged
	case cur == nil:
		cur = &member{incarnation: inc, changed: now}
		ids[id] = cur
		if !online {
			// Remember the tombstone: an online of this incarnation that
			// arrives late must not resurrect the instance.
			cur.off = offBy(src)
			return unchanged
		}
		return applied
	case inc < cur.incarnation:
		return stale
	case inc > cur.incarnation:
		wasLive := cur.live()
		cur.incarnation, cur.changed = inc, now
		if online {
			cur.off = offNone
		} else {
			cur.off = offBy(src)
		}
		if !wasLive && !online {
			return unchanged
		}
		return applied
	}
	// The same incarnation.
	if !online {
		switch {
		case src == fromEvent && cur.off != offAnnounced:
			wasLive := cur.live()
			cur.off, cur.changed = offAnnounced, now
			if wasLive {
				return applied
			}
			return unchanged
		case cur.live():
			cur.off, cur.changed = offBy(src), now
			return applied
		}
		return duplicate
	}
	switch {
	case cur.live():
		return duplicate
	case src == fromRegistry && cur.off == offRegistry, src == fromGossip && cur.off == offGossip:
		cur.off, cur.changed = offNone, now
		return applied
	}
	return stale
}

// addRegistered applies every registered instance of service as online:
// truth maps instance ID to incarnation. The ordering rules hold, so an
// instance whose offline arrived before its deregistration stays offline.
// It reports whether the live set changed.
func (m *membership) addRegistered(service string, truth map[string]int64, now time.Time) bool {
	changed := false
	for id, inc := range truth {
		if m.apply(service, id, inc, true, fromRegistry, now) == applied {
			changed = true
		}
	}
	return changed
}

// liveAbsent returns the live instances of service that truth does not
// hold, with their incarnations: candidates for removal once the registry
// confirms their absence (a local mirror may lag an event by a moment).
func (m *membership) liveAbsent(service string, truth map[string]int64) map[string]int64 {
	var out map[string]int64
	for id, mem := range m.services[service] {
		if _, ok := truth[id]; !ok && mem.live() {
			if out == nil {
				out = make(map[string]int64)
			}
			out[id] = mem.incarnation
		}
	}
	return out
}

// live returns the sorted live instance IDs of service.
func (m *membership) live(service string) []string {
	ids := m.services[service]
	out := make([]string, 0, len(ids))
	for id, mem := range ids {
		if mem.live() {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// serviceNames returns the services the table knows, sorted.
func (m *membership) serviceNames() []string {
	out := make([]string, 0, len(m.services))
	for s := range m.services {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// collect drops tombstones older than cutoff and services left empty.
func (m *membership) collect(cutoff time.Time) {
	for service, ids := range m.services {
		for id, mem := range ids {
			if !mem.live() && mem.changed.Before(cutoff) {
				delete(ids, id)
			}
		}
		if len(ids) == 0 {
			delete(m.services, service)
		}
	}
}
