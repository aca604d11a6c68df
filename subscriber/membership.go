package subscriber

import (
	"slices"
	"strings"
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
// member is two words: one live, confirmed by the registry and never
// offline while the table knew it, as most are, needs only its
// incarnation and revision; the rest (memberExtra) is in a map of its own
// for the few others. A service's members are held by value in a slice
// sorted by instance ID (memberSlot, 32 bytes), sized to the registry's
// count when the subscriber reconciles (membership.reserve): an instance
// costs 36 bytes at 100 instances per service, 33 at 1,000 and 10,000
// (BenchmarkTableBytes), against 53, 71 and 60 in a map of pointers to
// 16-byte members, whose room per entry varies with its count. A list
// that grew one member at a time has up to a quarter of its room spare
// (50, 33 and 37 bytes). Finding a member is a binary search, about
// twice a map's lookup (0.1 to 0.25 µs an event at 10,000 members), and
// listing a service's live members walks the list in order, 3 to 4 times
// faster than sorting a map's keys (BenchmarkTableOps).
type member struct {
	incarnation int64
	// rev is the registry revision (the mirror's, see
	// serverlist.MirrorStats.Revision) of the entry last seen; 0: none yet.
	rev uint64
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

// serviceMembers is the table of one service: its members sorted by
// instance ID, found by binary search, and the extras of the few that
// have one by instance ID (nil while none has).
type serviceMembers struct {
	ids   []memberSlot
	extra map[string]*memberExtra
}

// memberSlot is a member and its instance ID, as its service's list holds
// it: 32 bytes, the ID's bytes shared with the mirror's.
type memberSlot struct {
	id string
	member
}

// find returns the position of id in the list, or where it would go, and
// whether it is there.
func (sm *serviceMembers) find(id string) (int, bool) {
	return slices.BinarySearchFunc(sm.ids, id, func(s memberSlot, id string) int { return strings.Compare(s.id, id) })
}

// has reports whether the list holds id.
func (sm *serviceMembers) has(id string) bool {
	_, ok := sm.find(id)
	return ok
}

// incarnationOf returns the incarnation of member id, 0 for none.
func (sm *serviceMembers) incarnationOf(id string) int64 {
	if i, ok := sm.find(id); ok {
		return sm.ids[i].incarnation
	}
	return 0
}

// delete removes member id from the list, and its extra.
func (sm *serviceMembers) delete(id string) {
	if i, ok := sm.find(id); ok {
		sm.ids = slices.Delete(sm.ids, i, i+1)
	}
	sm.dropExtra(id)
}

// entry is a member as the table's methods read and change it (get): a
// copy of it, and its extra, nil for a member the registry confirmed that
// never went offline. The extra is allocated at the member's first
// offline, kept after, and for an unconfirmed member until the registry
// confirms it. A changed entry is stored with put.
type entry struct {
	member
	extra *memberExtra
}

func (e *entry) live() bool { return e.extra == nil || e.extra.off == offNone }

// confirmed reports whether the registry has held the instance.
func (e *entry) confirmed() bool { return e.extra == nil || !e.extra.unconfirmed }

// off says why the instance is offline; offNone means it is live.
func (e *entry) off() offReason {
	if e.extra == nil {
		return offNone
	}
	return e.extra.off
}

// goLive brings the member back (its last offline's revision is kept).
func (e *entry) goLive() {
	if e.extra != nil {
		e.extra.off = offNone
	}
}

// goOffline takes the member offline for reason off, as of revision rev,
// at changed.
func (e *entry) goOffline(off offReason, rev uint64, changed time.Duration) {
	if e.extra == nil {
		e.extra = new(memberExtra)
	}
	e.extra.off, e.extra.rev, e.extra.changed = off, rev, changed
}

// offRev is the revision of the member's last offline (0: none yet).
func (e *entry) offRev() uint64 {
	if e.extra == nil {
		return 0
	}
	return e.extra.rev
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
	services map[string]*serviceMembers
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
	return &membership{services: make(map[string]*serviceMembers), confirmedIn: make(map[string]int), epoch: time.Now()}
}

// stamp is t as a member's change time: the time since the table's epoch
// (monotonic when both times are).
func (m *membership) stamp(t time.Time) time.Duration { return t.Sub(m.epoch) }

// hasConfirmed reports whether the registry holds, or held, a member of
// service that the table still knows.
func (m *membership) hasConfirmed(service string) bool { return m.confirmedIn[service] > 0 }

// get returns the member service/id, and whether the table knows it.
func (m *membership) get(service, id string) (entry, bool) {
	sm := m.services[service]
	if sm == nil {
		return entry{}, false
	}
	i, ok := sm.find(id)
	if !ok {
		return entry{}, false
	}
	return entry{sm.ids[i].member, sm.extra[id]}, true
}

// put stores e as the member service/id, adding it (and its service) if
// new, and its extra, or that it has none.
func (m *membership) put(service, id string, e entry) {
	sm := m.services[service]
	if sm == nil {
		sm = &serviceMembers{}
		m.services[service] = sm
	}
	if i, ok := sm.find(id); ok {
		sm.ids[i].member = e.member
	} else {
		sm.ids = slices.Insert(sm.ids, i, memberSlot{id, e.member})
	}
	switch {
	case e.extra != nil:
		if sm.extra == nil {
			sm.extra = make(map[string]*memberExtra)
		}
		sm.extra[id] = e.extra
	case sm.extra != nil:
		sm.dropExtra(id)
	}
}

// reserve makes room for n members of service in all, so that a list the
// registry fills (a service's first reconciliation: every service at a
// gateway's start) takes what it holds, not what appends grow it to.
func (m *membership) reserve(service string, n int) {
	sm := m.services[service]
	if sm == nil {
		if n == 0 {
			return
		}
		sm = &serviceMembers{}
		m.services[service] = sm
	}
	if n > cap(sm.ids) {
		sm.ids = slices.Grow(sm.ids, n-len(sm.ids))
	}
}

// dropExtra deletes the extra of id, and the map of extras once empty.
func (sm *serviceMembers) dropExtra(id string) {
	if sm.extra == nil {
		return
	}
	delete(sm.extra, id)
	if len(sm.extra) == 0 {
		sm.extra = nil
	}
}

// forget updates the counts for a member leaving the table.
func (m *membership) forget(service string, e entry) {
	if !e.confirmed() {
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
	sm, ok := m.services[service]
	n := 0
	if ok {
		if sm.has(id) {
			return true
		}
		n = len(sm.ids)
	}
	switch {
	case lim.unconfirmed > 0 && m.nUnconfirmed >= lim.unconfirmed:
		return false
	case !ok && lim.services > 0 && len(m.services) >= lim.services:
		return false
	case lim.perService > 0 && n >= lim.perService:
		return false
	}
	return true
}

// limits bound what events alone can add to the table.
type limits struct {
	unconfirmed, services, perService int
}

// addUnconfirmed marks e, of service/id, as created by an event or gossip
// (the caller stores it).
func (m *membership) addUnconfirmed(service, id string, e *entry, now time.Time) {
	if e.extra == nil {
		e.extra = new(memberExtra)
	}
	e.extra.unconfirmed = true
	m.nUnconfirmed++
	m.unconfirmed = append(m.unconfirmed, pendingMember{service, id, now})
}

// confirm marks a member of service as held by the registry, and reports
// whether that changed it (the caller stores it). A live one with no
// offline to remember (an instance announced before the registry showed
// it, as at a fleet's start) lets its extra go: it is then as small as one
// the registry added.
func (m *membership) confirm(service string, e *entry) bool {
	if e.confirmed() {
		return false
	}
	e.extra.unconfirmed = false
	m.nUnconfirmed--
	m.confirmedIn[service]++
	if e.live() && e.extra.rev == 0 {
		e.extra = nil
	}
	return true
}

// remove deletes a member, and its service once empty.
func (m *membership) remove(service, id string) {
	e, ok := m.get(service, id)
	if !ok {
		return
	}
	m.forget(service, e)
	sm := m.services[service]
	sm.delete(id)
	if len(sm.ids) == 0 {
		delete(m.services, service)
	}
}

// dropService deletes every member of service (an unfollowed service).
func (m *membership) dropService(service string) {
	sm := m.services[service]
	if sm == nil {
		return
	}
	for _, slot := range sm.ids {
		m.forget(service, entry{slot.member, sm.extra[slot.id]})
	}
	delete(m.services, service)
}

// expire drops the members recorded before cutoff that the registry never
// confirmed: events naming instances nobody registered (an online event
// reaches a gateway after the registry write it follows, so a real instance
// is confirmed within the mirror's lag). It returns the services whose live
// set changed.
func (m *membership) expire(cutoff time.Time) (changed []string, dropped int) {
	servicesBefore := len(m.services)
	// Of the services this pass shrinks: their members and extras before.
	sizeBefore := map[string][2]int{}
	i := 0
	for ; i < len(m.unconfirmed) && m.unconfirmed[i].at.Before(cutoff); i++ {
		p := m.unconfirmed[i]
		e, ok := m.get(p.service, p.id)
		if !ok || e.confirmed() {
			continue // gone or confirmed since
		}
		if _, ok := sizeBefore[p.service]; !ok {
			sm := m.services[p.service]
			sizeBefore[p.service] = [2]int{len(sm.ids), len(sm.extra)}
		}
		if e.live() {
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
	// Go maps and slices keep their size when entries go: after a flood,
	// copy the lists and maps that shrank a lot, so that memory returns to
	// its idle figure.
	// (A service's map of extras goes once empty: see dropExtra.)
	if servicesBefore >= shrinkMin && len(m.services) <= servicesBefore/4 {
		m.services = copyMap(m.services)
	}
	for svc, before := range sizeBefore {
		sm := m.services[svc]
		if sm == nil {
			continue
		}
		if shrank(before[0], len(sm.ids)) {
			sm.ids = slices.Clone(sm.ids)
		}
		if shrank(before[1], len(sm.extra)) && sm.extra != nil {
			sm.extra = copyMap(sm.extra)
		}
	}
	slices.Sort(changed)
	return slices.Compact(changed), dropped
}

// shrinkMin is the map size below which shrinking is not worth a copy.
const shrinkMin = 256

// shrank reports whether a map or list of before entries that now holds
// after shrank enough to be copied.
func shrank(before, after int) bool { return before >= shrinkMin && after <= before/4 }

// copyMap returns a copy of m sized for its content.
func copyMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
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
	cur, known := m.get(service, id)
	off := offAnnounced
	if src == fromGossip {
		off = offGossip
	}
	switch {
	case online && src == fromGossip && (!known || inc != cur.incarnation):
		// Gossip seeing a node alive only undoes its own suspicion: an
		// instance becomes live by announcing (or registering), which may
		// reach us after its gossip.
		return unchanged
	case !known:
		cur = entry{member: member{incarnation: inc}}
		m.addUnconfirmed(service, id, &cur, now)
		out := applied
		if !online {
			// Remember the tombstone: an online of this incarnation that
			// arrives late must not resurrect the instance.
			cur.goOffline(off, regRev, m.stamp(now))
			out = unchanged
		}
		m.put(service, id, cur)
		return out
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
		m.put(service, id, cur)
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
			m.put(service, id, cur)
			if wasLive {
				return applied
			}
			return unchanged
		case cur.live():
			cur.goOffline(off, regRev, m.stamp(now))
			m.put(service, id, cur)
			return applied
		}
		return duplicate
	}
	switch {
	case cur.live():
		return duplicate
	case src == fromGossip && cur.off() == offGossip:
		cur.goLive()
		m.put(service, id, cur)
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
	cur, known := m.get(service, id)
	if !known {
		m.put(service, id, entry{member: member{incarnation: inc, rev: rev}})
		m.confirmedIn[service]++
		return applied
	}
	confirmed := m.confirm(service, &cur)
	out := m.registeredKnown(&cur, inc, rev)
	if confirmed || out != duplicate && out != stale {
		m.put(service, id, cur)
	}
	return out
}

// registeredKnown is registered for a member the table knows, cur, which
// it changes unless the write is a duplicate or stale (the caller stores
// it).
func (m *membership) registeredKnown(cur *entry, inc int64, rev uint64) outcome {
	switch {
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
	cur, known := m.get(service, id)
	if !known || !cur.live() || cur.incarnation != inc || cur.rev > recRev {
		return unchanged
	}
	cur.goOffline(offAdvisory, recRev, m.stamp(now))
	m.put(service, id, cur)
	return applied
}

// unregistered records that a direct read found instance id gone from the
// registry; asOf is the mirror's revision when the read began. An entry
// written since (rev above asOf) wins over the read.
func (m *membership) unregistered(service, id string, asOf uint64, now time.Time) outcome {
	cur, known := m.get(service, id)
	if !known || !cur.live() || cur.rev > asOf {
		return unchanged
	}
	cur.goOffline(offRegistry, asOf, m.stamp(now))
	m.put(service, id, cur)
	return applied
}

// regEntry is what the registry holds of one instance.
type regEntry struct {
	id  string
	inc int64
	rev uint64
}

// addRegistered applies every registered instance of service: truth is
// the registry's instances of service sorted by ID. It reports whether the
// live set changed.
func (m *membership) addRegistered(service string, truth []regEntry, now time.Time) bool {
	changed := false
	m.reserve(service, len(truth))
	for _, e := range truth {
		if m.registered(service, e.id, e.inc, e.rev, now) == applied {
			changed = true
		}
	}
	return changed
}

// isLive reports whether member id of sm, which sm holds, is live: a
// member without extra is.
func (sm *serviceMembers) isLive(id string) bool {
	x := sm.extra[id]
	return x == nil || x.off == offNone
}

// liveAbsent returns the live instances of service that truth (sorted by
// ID) does not hold, sorted: candidates for removal once the registry
// confirms their absence (a local mirror may lag an event by a moment).
func (m *membership) liveAbsent(service string, truth []regEntry) []string {
	var out []string
	sm := m.services[service]
	if sm == nil {
		return nil
	}
	j := 0
	for _, slot := range sm.ids {
		for j < len(truth) && truth[j].id < slot.id {
			j++
		}
		if (j == len(truth) || truth[j].id != slot.id) && sm.isLive(slot.id) {
			out = append(out, slot.id)
		}
	}
	return out
}

// live returns the sorted live instance IDs of service.
func (m *membership) live(service string) []string {
	sm := m.services[service]
	if sm == nil {
		return []string{}
	}
	out := make([]string, 0, len(sm.ids))
	for _, slot := range sm.ids {
		if sm.extra == nil || sm.isLive(slot.id) {
			out = append(out, slot.id)
		}
	}
	return out
}

// digest sums a list of service, live as returned by live (sorted by ID):
// each ID with its incarnation (convergence.ListDigest).
func (m *membership) digest(service string, live []string) string {
	d := convergence.NewListDigest()
	sm := m.services[service]
	for _, id := range live {
		var inc int64
		if sm != nil {
			inc = sm.incarnationOf(id)
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

// collect drops tombstones older than cutoff and services left empty. Only
// a member with an extra can be offline.
func (m *membership) collect(cutoff time.Time) {
	for service, sm := range m.services {
		for id, x := range sm.extra {
			if x.off != offNone && x.changed < m.stamp(cutoff) {
				if i, ok := sm.find(id); ok {
					m.forget(service, entry{sm.ids[i].member, x})
				}
				sm.delete(id)
			}
		}
		if len(sm.ids) == 0 {
			delete(m.services, service)
		}
	}
}
