package subscriber

import (
	"slices"
	"testing"
	"time"
	"unsafe"
)

// huge is an incarnation far beyond any real one, as a forger would claim.
const huge = int64(1) << 62

func TestMembershipOrdering(t *testing.T) {
	// kind: e (event), g (gossip), r (registry put at rev), u (registry
	// read found it gone, as of rev). For e and g, rev is the mirror's
	// revision when the observation is applied.
	type step struct {
		kind   byte
		inc    int64
		online bool
		rev    uint64
		want   outcome
		live   bool
	}
	for name, steps := range map[string][]step{
		"online, duplicate, offline": {
			{'e', 1, true, 0, applied, true}, {'e', 1, true, 0, duplicate, true}, {'e', 1, false, 0, applied, false}, {'e', 1, false, 0, duplicate, false},
		},
		"late online of same incarnation is stale, and so is the registry write before the offline": {
			{'r', 1, true, 5, applied, true}, {'e', 1, false, 5, applied, false}, {'e', 1, true, 5, stale, false}, {'r', 1, true, 5, stale, false},
		},
		"offline before online (reordered)": {
			{'e', 1, false, 0, unchanged, false}, {'e', 1, true, 0, stale, false},
		},
		"restart then delayed offline of the old incarnation": {
			{'e', 1, true, 0, applied, true}, {'e', 2, true, 0, applied, true}, {'e', 1, false, 0, stale, true},
		},
		"restart reported before the old offline": {
			{'e', 1, true, 0, applied, true}, {'e', 1, false, 0, applied, false}, {'e', 2, true, 0, applied, true},
		},
		"registry loss is revived by a later registry write": {
			{'r', 1, true, 1, applied, true}, {'u', 0, false, 1, applied, false}, {'e', 1, true, 1, stale, false}, {'r', 1, true, 2, applied, true},
		},
		"a direct read older than the entry the mirror holds removes nothing": {
			{'r', 1, true, 3, applied, true}, {'u', 0, false, 2, unchanged, true},
		},
		"gossip dead, refuted": {
			{'e', 1, true, 0, applied, true}, {'g', 1, false, 0, applied, false}, {'e', 1, true, 0, stale, false}, {'g', 1, true, 0, applied, true},
		},
		"late gossip dead of an old incarnation": {
			{'e', 1, true, 0, applied, true}, {'e', 2, true, 0, applied, true}, {'g', 1, false, 0, stale, true},
		},
		"gossip dead then restart": {
			{'e', 1, true, 0, applied, true}, {'g', 1, false, 0, applied, false}, {'e', 2, true, 0, applied, true},
		},
		"gossip dead, then a lease refresh proves it alive": {
			{'r', 1, true, 1, applied, true}, {'g', 1, false, 1, applied, false}, {'r', 1, true, 2, applied, true},
		},
		"gossip alone does not add, nor block the announcement": {
			{'g', 1, true, 0, unchanged, false}, {'e', 1, true, 0, applied, true},
		},
		"gossip alive of a newer incarnation waits for its announcement": {
			{'e', 1, true, 0, applied, true}, {'g', 2, true, 0, unchanged, true}, {'e', 1, false, 0, applied, false}, {'e', 2, true, 0, applied, true},
		},
		"gossip alive does not undo an announced offline": {
			{'e', 1, true, 0, applied, true}, {'e', 1, false, 0, applied, false}, {'g', 1, true, 0, stale, false},
		},
		"a forged offline of any incarnation lasts until the next registry write": {
			{'r', 1, true, 3, applied, true}, {'e', huge, false, 3, applied, false}, {'e', 1, true, 3, stale, false},
			{'r', 1, true, 3, stale, false}, {'r', 1, true, 4, applied, true},
			// Events order the registry's incarnation again: its real offline applies.
			{'e', 1, false, 4, applied, false},
		},
		"a restarted instance is routed whatever an offline claimed": {
			{'r', 1, true, 1, applied, true}, {'e', huge, false, 1, applied, false}, {'e', 2, true, 1, stale, false}, {'r', 2, true, 2, applied, true},
		},
		"a tombstone for an unknown ID does not shut out its registration": {
			{'e', huge, false, 7, unchanged, false}, {'r', 5, true, 8, applied, true},
		},
		"a forged online of a huge incarnation is undone by the next registry write": {
			{'r', 1, true, 1, applied, true}, {'e', huge, true, 1, applied, true}, {'e', 1, false, 1, stale, true},
			{'r', 1, true, 2, unchanged, true}, {'e', 1, false, 2, applied, false},
		},
		"a direct read whose revision is unknown keeps a live instance, revives nothing": {
			{'e', 1, true, 0, applied, true}, {'r', 1, true, 0, duplicate, true}, {'e', 1, false, 0, applied, false}, {'r', 1, true, 0, stale, false},
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := newMembership()
			for i, s := range steps {
				var got outcome
				switch s.kind {
				case 'e':
					got = m.event("svc", "i-1", s.inc, s.online, fromEvent, s.rev, time.Now())
				case 'g':
					got = m.event("svc", "i-1", s.inc, s.online, fromGossip, s.rev, time.Now())
				case 'r':
					got = m.registered("svc", "i-1", s.inc, s.rev, time.Now())
				case 'u':
					got = m.unregistered("svc", "i-1", s.rev, time.Now())
				}
				if got != s.want {
					t.Fatalf("step %d (%c): outcome %v, want %v", i, s.kind, got, s.want)
				}
				if live := slices.Contains(m.live("svc"), "i-1"); live != s.live {
					t.Fatalf("step %d (%c): live %v, want %v", i, s.kind, live, s.live)
				}
			}
		})
	}
}

func TestMembershipRegistryAndCollect(t *testing.T) {
	m := newMembership()
	now := time.Now()
	if !m.addRegistered("svc", []regEntry{{"a", 1, 1}, {"b", 1, 2}}, now) {
		t.Fatal("registering two instances is a change")
	}
	m.event("svc", "c", 5, true, fromEvent, 2, now)
	absent := m.liveAbsent("svc", []regEntry{{"a", 1, 1}})
	if !slices.Equal(absent, []string{"b", "c"}) {
		t.Fatalf("absent %v", absent)
	}
	m.event("svc", "b", 1, false, fromEvent, 2, now)
	m.collect(now.Add(time.Second))
	if _, ok := m.get("svc", "b"); ok {
		t.Fatal("old tombstone not collected")
	}
	if got := m.live("svc"); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("live %v", got)
	}
}

func TestMembershipLimitsAndExpiry(t *testing.T) {
	m := newMembership()
	lim := limits{unconfirmed: 3, services: 2, perService: 2}
	t0 := time.Unix(100, 0)
	add := func(svc, id string, at time.Time) bool {
		if !m.admits(svc, id, lim) {
			return false
		}
		m.event(svc, id, 1, true, fromEvent, 0, at)
		return true
	}
	if !add("a", "1", t0) || !add("a", "2", t0) {
		t.Fatal("within the limits")
	}
	if add("a", "3", t0) {
		t.Fatal("a third instance of a: beyond instances per service")
	}
	if !add("b", "1", t0.Add(time.Second)) {
		t.Fatal("a second service")
	}
	if add("c", "1", t0) {
		t.Fatal("a third service, and beyond the unconfirmed limit")
	}
	if !m.admits("a", "1", lim) {
		t.Fatal("a known member is always admitted")
	}
	// a/1 is confirmed by the registry: it stays; a/2 expires.
	m.registered("a", "1", 1, 5, t0)
	changed, dropped := m.expire(t0.Add(500 * time.Millisecond))
	if dropped != 1 || !slices.Equal(changed, []string{"a"}) || m.lookup("a", "2") != nil || m.lookup("a", "1") == nil {
		t.Fatalf("expire: changed %v, dropped %d", changed, dropped)
	}
	if m.nUnconfirmed != 1 {
		t.Fatalf("unconfirmed count %d, want 1 (b/1)", m.nUnconfirmed)
	}
	changed, dropped = m.expire(t0.Add(2 * time.Second))
	if dropped != 1 || !slices.Equal(changed, []string{"b"}) || m.services["b"] != nil || m.nUnconfirmed != 0 {
		t.Fatalf("second expire: changed %v, dropped %d, services %v", changed, dropped, m.serviceNames())
	}
}

// lookup returns a copy of the member service/id, nil if the table does
// not know it.
func (m *membership) lookup(service, id string) *entry {
	e, ok := m.get(service, id)
	if !ok {
		return nil
	}
	return &e
}

// TestMemberSize: the table holds one member per instance; a live,
// confirmed one is 16 bytes, 32 with its ID in its service's slice (its
// offline state, or its want of confirmation, is in a map apart:
// serviceMembers.extra).
func TestMemberSize(t *testing.T) {
	if size := unsafe.Sizeof(member{}); size > 16 {
		t.Errorf("a member takes %d bytes, want at most 16", size)
	}
	if size := unsafe.Sizeof(memberSlot{}); size > 32 {
		t.Errorf("a member's slot takes %d bytes, want at most 32", size)
	}
	if size := unsafe.Sizeof(memberExtra{}); size > 24 {
		t.Errorf("a member's extra takes %d bytes, want at most 24", size)
	}
}

// TestMemberExtraConfirmed: a member an event added is unconfirmed (it has
// an extra saying so) until the registry holds it; confirmed, a live one
// with no offline to remember lets its extra go, and a tombstone, or one
// back from an offline, keeps the offline's revision.
func TestMemberExtraConfirmed(t *testing.T) {
	m := newMembership()
	now := m.epoch.Add(time.Minute)
	m.event("a", "live", 1, true, fromEvent, 0, now)
	m.event("a", "dead", 1, false, fromEvent, 7, now)
	m.event("a", "back", 1, true, fromEvent, 0, now)
	m.event("a", "back", 1, false, fromGossip, 8, now)
	m.event("a", "back", 1, true, fromGossip, 8, now)
	for _, id := range []string{"live", "dead", "back"} {
		if mem := m.lookup("a", id); mem.confirmed() || mem.extra == nil {
			t.Fatalf("%s: confirmed before the registry held it", id)
		}
	}
	if m.nUnconfirmed != 3 || m.hasConfirmed("a") {
		t.Fatalf("%d unconfirmed, want 3; confirmed in a: %v", m.nUnconfirmed, m.hasConfirmed("a"))
	}
	for _, id := range []string{"live", "dead", "back"} {
		m.registered("a", id, 1, 5, now)
	}
	if m.nUnconfirmed != 0 || m.confirmedIn["a"] != 3 {
		t.Fatalf("%d unconfirmed, %d confirmed; want 0 and 3", m.nUnconfirmed, m.confirmedIn["a"])
	}
	if mem := m.lookup("a", "live"); mem.extra != nil || !mem.live() || !mem.confirmed() || mem.rev != 5 {
		t.Fatalf("live: %+v, extra %+v; want a confirmed live member without extra", mem, mem.extra)
	}
	if mem := m.lookup("a", "dead"); !mem.confirmed() || mem.live() || mem.offRev() != 7 {
		t.Fatalf("dead: confirmed %v, live %v, offline revision %d; want a confirmed tombstone of revision 7", mem.confirmed(), mem.live(), mem.offRev())
	}
	if mem := m.lookup("a", "back"); !mem.confirmed() || !mem.live() || mem.offRev() != 8 {
		t.Fatalf("back: confirmed %v, live %v, offline revision %d; want it live, its offline of revision 8 kept", mem.confirmed(), mem.live(), mem.offRev())
	}
	// The offline kept still orders an announced offline (max(8, 6)), and
	// the member whose extra went takes a new one.
	if m.event("a", "back", 1, false, fromEvent, 6, now) != applied || m.lookup("a", "back").offRev() != 8 {
		t.Fatal("back: an announced offline does not keep the later offline revision")
	}
	if m.event("a", "live", 1, false, fromEvent, 9, now) != applied || m.lookup("a", "live").offRev() != 9 || m.lookup("a", "live").live() {
		t.Fatal("live: an announced offline not recorded")
	}
	if m.registered("a", "live", 1, 9, now) != unchanged || m.registered("a", "live", 1, 10, now) != applied {
		t.Fatal("live: the registry's writes are not ordered against its offline")
	}
}

// TestMemberOfflineStateLazy: a member has its offline state from its
// first offline on: none while it only ever was live; an offline records
// its revision, so that an older registry write does not bring it back and
// a newer one does; a tombstone is collected by the age of its offline.
func TestMemberOfflineStateLazy(t *testing.T) {
	m := newMembership()
	t0 := m.epoch.Add(time.Minute)
	if got := m.registered("a", "i1", 1, 10, t0); got != applied {
		t.Fatalf("registered: %v", got)
	}
	cur := m.lookup("a", "i1")
	if cur.extra != nil || cur.offRev() != 0 {
		t.Fatal("a live member has an offline state")
	}
	got := m.event("a", "i1", 1, false, fromEvent, 20, t0.Add(time.Second))
	if cur = m.lookup("a", "i1"); got != applied || cur.extra == nil || cur.offRev() != 20 {
		t.Fatalf("offline event: %v, offline state %+v", got, cur.extra)
	}
	got = m.registered("a", "i1", 1, 15, t0.Add(2*time.Second))
	if cur = m.lookup("a", "i1"); got != unchanged || cur.live() {
		t.Fatalf("a write older than the offline: %v, live %v; want it offline", got, cur.live())
	}
	got = m.registered("a", "i1", 1, 25, t0.Add(3*time.Second))
	if cur = m.lookup("a", "i1"); got != applied || !cur.live() {
		t.Fatalf("a write newer than the offline: %v, live %v; want it back", got, cur.live())
	}
	if got := m.event("a", "i1", 1, false, fromGossip, 30, t0.Add(4*time.Second)); got != applied {
		t.Fatalf("gossip offline: %v", got)
	}
	m.collect(t0.Add(4 * time.Second)) // offline at 4 s: not older than the cutoff
	if m.lookup("a", "i1") == nil {
		t.Fatal("a tombstone collected before its age")
	}
	m.collect(t0.Add(5 * time.Second))
	if m.lookup("a", "i1") != nil {
		t.Fatal("a tombstone older than the cutoff kept")
	}
}
