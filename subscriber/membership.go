package subscriber

import (
	"slices"
	"time"

	"github.com/pushlb/pushlb/convergence"
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
//
// Two orders meet here. The registry's revisions are assigned by the NATS
// server and nobody can forge them; incarnations are claimed by whoever
// publishes an event. The registry decides what is current: a registry
// write observed after an offline (rev above offRev) brings the instance
// back with the registry's incarnation, whatever incarnation the offline
// claimed. Incarnations only order events about the life the registry last
// showed (or a newer one an event announced since).
//
// The table holds one per instance (100,000 in a large fleet), so a
// member is three words (24 bytes, an allocation of that size class): one
// live, confirmed by the registry and never offline while the table knew
// it, as most are, needs only its incarnation and revision; the rest
// (extra) is allocated for the few others. With its map entry, an
// instance then costs 60 bytes at 100 instances per service, 79 at 1,000,
// 68 at 10,000 (a Go map's room per entry varies with its count): 8 less
// than with a 32-byte member. Members held in the maps by value would
// cost 55, 99 and 79 bytes (24-byte values; 67, 115 and 92 with 32): a
// map's slack, up to half its room after a split, grows with the value,
// while a separate allocation is exact.
type member struct {
	incarnation int64
	// rev is the registry revision (the mirror's, see
	// serverlist.MirrorStats.Revision) of the entry last seen; 0: none yet.
	rev uint64
	// extra is nil for a member the registry confirmed that never went
	// offline; it is allocated at its first offline, kept after, and for
	// an unconfirmed member until the registry confirms it.
	extra *memberExtra
}

// memberExtra is what few members need: whether (and why) the instance is
// offline and when and as of which revision it last went offline; or that
// the registry has not confirmed it. 24 bytes.
type memberExtra struct {
	// rev is the mirror's revision when the offline was recorded: while
	// offline, a registry write above it is newer than the offline.
	rev uint64
	// changed is when it went offline, since the table's epoch
	// (membership.stamp); tombstones are collected by age.
	changed time.Duration
	// off says why the instance is offline; offNone means it is live.
	off offReason
	// unconfirmed says the registry has not held the instance: only
	// events or gossip know it, and the table keeps few such members, for
	// a short while (see membership.expire).
	unconfirmed bool
}

func (m *member) live() bool { return m.extra == nil || m.extra.off == offNone }

// confirmed reports whether the registry has held the instance.
func (m *member) confirmed() bool { return m.extra == nil || !m.extra.unconfirmed }

// off says why the instance is offline; offNone means it is live.
func (m *member) off() offReason {
	if m.extra == nil {
		return offNone
	}
	return m.extra.off
}

// goLive brings the member back (its last offline's revision is kept).
func (m *member) goLive() {
	if m.extra != nil {
		m.extra.off = offNone
	}
}

// goOffline takes the member offline for reason off, as of revision rev,
// at changed.
func (m *member) goOffline(off offReason, rev uint64, changed time.Duration) {
	if m.extra == nil {
		m.extra = new(memberExtra)
	}
	m.extra.off, m.extra.rev, m.extra.changed = off, rev, changed
}

// offRev is the revision of the member's last offline (0: none yet).
func (m *member) offRev() uint64 {
	if m.extra == nil {
		return 0
	}
	return m.extra.rev
}

// offReason records who took an instance offline, which decides who may
// bring it back within the same incarnation.
type offReason uint8

const (
	offNone      offReason = iota
	offAnnounced           // an offline event: final for the incarnation, until the registry is written again
	offRegistry            // the registry lost it (deregistered, lease expired)
	offGossip              // gossip declared it dead: gossip may bring it back (a refuted suspicion)
	offAdvisory            // its NATS connection ended and a probe found it dead: final for the record's revision
)

// source tells where an observation comes from.
type source uint8

const (
	fromEvent source = iota
	fromGossip
)

// membership is the table service -> instance ID -> member. It keeps
// tombstones (offline members) so that a late event of an old incarnation
// cannot bring an instance back. It is not safe for concurrent use: the
// Subscriber guards it with its mutex.
type membership struct {
	services map[string]map[string]*member
	// epoch is the time members' changes are stamped from (stamp).
	epoch time.Time

	// Unconfirmed members (known from events or gossip only), oldest
	// first, so expire can drop those the registry never confirmed.
	unconfirmed  []pendingMember
	nUnconfirmed int
	// confirmedIn counts the confirmed members of each service: a service
	// with none is known from events only, and its lists wait for the
	// registry (see hasConfirmed).
	confirmedIn map[string]int
}

// pendingMember is an unconfirmed member and when it was recorded.
type pendingMember struct {
	service, id string
	at          time.Time
}

func newMembership() *membership {
	return &membership{services: make(map[string]map[string]*member), confirmedIn: make(map[string]int), epoch: time.Now()}
}

// stamp is t as a member's change time: the time since the table's epoch
// (monotonic when both times are).
func (m *membership) stamp(t time.Time) time.Duration { return t.Sub(m.epoch) }

// hasConfirmed reports whether the registry holds, or held, a member of
// service that the table still knows.
func (m *membership) hasConfirmed(service string) bool { return m.confirmedIn[service] > 0 }

// forget updates the counts for a member leaving the table.
func (m *membership) forget(service string, mem *member) {
	if !mem.confirmed() {
		m.nUnconfirmed--
		return
	}
	if m.confirmedIn[service]--; m.confirmedIn[service] <= 0 {
		delete(m.confirmedIn, service)
	}
}

// admits reports whether an event about service/id may be recorded:
// members the table knows are, and a new one only within the limits on
// unconfirmed members, services and instances per service. A zero limit is
// no limit.
func (m *membership) admits(service, id string, lim limits) bool {
	ids, ok := m.services[service]
	if ok && ids[id] != nil {
		return true
	}
	switch {
	case lim.unconfirmed > 0 && m.nUnconfirmed >= lim.unconfirmed:
		return false
	case !ok && lim.services > 0 && len(m.services) >= lim.services:
		return false
	case lim.perService > 0 && len(ids) >= lim.perService:
		return false
	}
	return true
}

// limits bound what events alone can add to the table.
type limits struct {
	unconfirmed, services, perService int
}

// addUnconfirmed records mem, of service/id, created by an event or gossip.
func (m *membership) addUnconfirmed(service, id string, mem *member, now time.Time) {
	if mem.extra == nil {
		mem.extra = new(memberExtra)
	}
	mem.extra.unconfirmed = true
	m.nUnconfirmed++
	m.unconfirmed = append(m.unconfirmed, pendingMember{service, id, now})
}

// confirm marks a member of service as held by the registry. A live one
// with no offline to remember (an instance announced before the registry
// showed it, as at a fleet's start) lets its extra go: it is then as small
// as one the registry added.
func (m *membership) confirm(service string, mem *member) {
	if mem.confirmed() {
		return
	}
	mem.extra.unconfirmed = false
	m.nUnconfirmed--
	m.confirmedIn[service]++
	if mem.live() && mem.extra.rev == 0 {
		mem.extra = nil
	}
}

// remove deletes a member, and its service once empty.
func (m *membership) remove(service, id string) {
	ids := m.services[service]
	mem := ids[id]
	if mem == nil {
		return
	}
	m.forget(service, mem)
	delete(ids, id)
	if len(ids) == 0 {
		delete(m.services, service)
	}
}

// dropService deletes every member of service (an unfollowed service).
func (m *membership) dropService(service string) {
	for id := range m.services[service] {
		m.remove(service, id)
	}
}

// expire drops the members recorded before cutoff that the registry never
// confirmed: events naming instances nobody registered (an online event
// reaches a gateway after the registry write it follows, so a real instance
// is confirmed within the mirror's lag). It returns the services whose live
// set changed.
func (m *membership) expire(cutoff time.Time) (changed []string, dropped int) {
	servicesBefore := len(m.services)
	sizeBefore := map[string]int{} // of the services this pass shrinks
	i := 0
	for ; i < len(m.unconfirmed) && m.unconfirmed[i].at.Before(cutoff); i++ {
		p := m.unconfirmed[i]
		mem := m.services[p.service][p.id]
		if mem == nil || mem.confirmed() {
			continue // gone or confirmed since
		}
		if _, ok := sizeBefore[p.service]; !ok {
			sizeBefore[p.service] = len(m.services[p.service])
		}
		if mem.live() {
			changed = append(changed, p.service)
		}
		m.remove(p.service, p.id)
		dropped++
	}
	if i == len(m.unconfirmed) {
		m.unconfirmed = nil // let a flood's backlog go
	} else {
		m.unconfirmed = slices.Delete(m.unconfirmed, 0, i)
	}
	// Go maps keep their size when entries go: after a flood, copy the
	// maps that shrank a lot, so that memory returns to its idle figure.
	if servicesBefore >= shrinkMin && len(m.services) <= servicesBefore/4 {
		m.services = copyMap(m.services)
	}
	for svc, before := range sizeBefore {
		if ids := m.services[svc]; before >= shrinkMin && len(ids) <= before/4 && ids != nil {
			m.services[svc] = copyMap(ids)
		}
	}
	slices.Sort(changed)
	return slices.Compact(changed), dropped
}

// shrinkMin is the map size below which shrinking is not worth a copy.
const shrinkMin = 256

// copyMap returns a copy of m sized for its content.
func copyMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (m *membership) member(service, id string) *member {
	return m.services[service][id]
}

// add records a new member.
func (m *membership) add(service, id string, mem *member) {
	ids := m.services[service]
	if ids == nil {
		ids = make(map[string]*member)
		m.services[service] = ids
	}
	ids[id] = mem
}

// event records that instance id of service is online (or offline) in
// incarnation inc, as an event or gossip (src) says; regRev is the mirror's
// revision now. The ordering rules:
//   - a lower incarnation than the one known is stale;
//   - a higher incarnation replaces what is known (a restart is a change
//     even when the instance stays live: its address may differ);
//   - within one incarnation an instance announces online once and
//     offline once, so an announced offline stays until the registry is
//     written again (a refresh, a re-registration: see registered); one
//     gossip declared dead comes back when gossip sees it alive (a refuted
//     suspicion) or the registry is written again. An online event never
//     revives: it is the announcement the instance already made.
func (m *membership) event(service, id string, inc int64, online bool, src source, regRev uint64, now time.Time) outcome {
	cur := m.member(service, id)
	off := offAnnounced
	if src == fromGossip {
		off = offGossip
	}
	switch {
	case online && src == fromGossip && (cur == nil || inc != cur.incarnation):
		// Gossip seeing a node alive only undoes its own suspicion: an
		// instance becomes live by announcing (or registering), which may
		// reach us after its gossip.
		return unchanged
	case cur == nil:
		cur = &member{incarnation: inc}
		m.add(service, id, cur)
		m.addUnconfirmed(service, id, cur, now)
		if !online {
			// Remember the tombstone: an online of this incarnation that
			// arrives late must not resurrect the instance.
			cur.goOffline(off, regRev, m.stamp(now))
			return unchanged
		}
		return applied
	case inc < cur.incarnation:
		return stale
	case inc > cur.incarnation:
		wasLive := cur.live()
		cur.incarnation = inc
		if online {
			cur.goLive()
		} else {
			cur.goOffline(off, regRev, m.stamp(now))
		}
		if !wasLive && !online {
			return unchanged
		}
		return applied
	}
	// The same incarnation.
	if !online {
		switch {
		case src == fromEvent && cur.off() != offAnnounced:
			wasLive := cur.live()
			cur.goOffline(offAnnounced, max(cur.offRev(), regRev), m.stamp(now))
			if wasLive {
				return applied
			}
			return unchanged
		case cur.live():
			cur.goOffline(off, regRev, m.stamp(now))
			return applied
		}
		return duplicate
	}
	switch {
	case cur.live():
		return duplicate
	case src == fromGossip && cur.off() == offGossip:
		cur.goLive()
		return applied
	}
	return stale
}

// registered records that the registry holds instance id of service in
// incarnation inc at (mirror) revision rev; rev 0 means a direct read whose
// revision is not comparable: it keeps a live instance live and revives
// nothing. A write newer than what the table knows is authoritative: its
// incarnation becomes the one events are ordered against, and an instance
// taken offline before it (offRev below rev), by whatever event, comes back.
func (m *membership) registered(service, id string, inc int64, rev uint64, now time.Time) outcome {
	cur := m.member(service, id)
	if cur != nil {
		m.confirm(service, cur)
	}
	switch {
	case cur == nil:
		m.add(service, id, &member{incarnation: inc, rev: rev})
		m.confirmedIn[service]++
		return applied
	case rev == 0:
		if cur.live() {
			return duplicate
		}
		return stale
	case rev <= cur.rev:
		if cur.live() {
			return duplicate
		}
		return stale
	}
	cur.rev = rev
	if cur.live() {
		cur.incarnation = inc
		return unchanged
	}
	if rev <= cur.offRev() {
		// The write came before the offline did: it stays offline.
		return unchanged
	}
	cur.incarnation = inc
	cur.goLive()
	return applied
}

// crashed records that instance id of service, in incarnation inc, whose
// record the mirror held at revision recRev, died: its NATS connection
// ended and a probe found nothing there. The offline holds for that
// record: a registry write after recRev (the instance re-asserting itself
// after a reconnect) brings it back, as one after any offline does. An
// instance not live, of another incarnation, or whose table entry already
// reflects a later write, is left as it is.
func (m *membership) crashed(service, id string, inc int64, recRev uint64, now time.Time) outcome {
	cur := m.member(service, id)
	if cur == nil || !cur.live() || cur.incarnation != inc || cur.rev > recRev {
		return unchanged
	}
	cur.goOffline(offAdvisory, recRev, m.stamp(now))
	return applied
}

// unregistered records that a direct read found instance id gone from the
// registry; asOf is the mirror's revision when the read began. An entry
// written since (rev above asOf) wins over the read.
func (m *membership) unregistered(service, id string, asOf uint64, now time.Time) outcome {
	cur := m.services[service][id]
	if cur == nil || !cur.live() || cur.rev > asOf {
		return unchanged
	}
	cur.goOffline(offRegistry, asOf, m.stamp(now))
	return applied
}

// regEntry is what the registry holds of one instance.
type regEntry struct {
	inc int64
	rev uint64
}

// addRegistered applies every registered instance of service: truth maps
// instance ID to its registry entry. It reports whether the live set
// changed.
func (m *membership) addRegistered(service string, truth map[string]regEntry, now time.Time) bool {
	changed := false
	for id, e := range truth {
		if m.registered(service, id, e.inc, e.rev, now) == applied {
			changed = true
		}
	}
	return changed
}

// liveAbsent returns the live instances of service that truth does not
// hold: candidates for removal once the registry confirms their absence (a
// local mirror may lag an event by a moment).
func (m *membership) liveAbsent(service string, truth map[string]regEntry) []string {
	var out []string
	for id, mem := range m.services[service] {
		if _, ok := truth[id]; !ok && mem.live() {
			out = append(out, id)
		}
	}
	slices.Sort(out)
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

// digest sums a list of service, live as returned by live (sorted by ID):
// each ID with its incarnation (convergence.ListDigest).
func (m *membership) digest(service string, live []string) string {
	d := convergence.NewListDigest()
	members := m.services[service]
	for _, id := range live {
		var inc int64
		if mem := members[id]; mem != nil {
			inc = mem.incarnation
		}
		d.Add(id, inc)
	}
	return d.Sum()
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
			if !mem.live() && mem.extra.changed < m.stamp(cutoff) {
				m.forget(service, mem)
				delete(ids, id)
			}
		}
		if len(ids) == 0 {
			delete(m.services, service)
		}
	}
}
