package serverlist

// The mirror's in-memory index: the immutable, copy-on-write view of the
// bucket (services, their instances, each entry's revision and value sum)
// and the lock-free read methods over it. The watch loop (mirror.go) feeds
// it through the apply path (mirror_apply.go).

import (
	"cmp"
	"hash/maphash"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/pushlb/pushlb/balancer"
)

// mirrorState is one view of the bucket: its services. It is never modified
// once stored in Mirror.state, and is replaced (copied) only when a service
// appears or goes. Each service's instances are a list of their own,
// replaced (copied) on every change to that service: a change to one
// instance copies its service's list, not every service's.
type mirrorState struct {
	services map[string]*mirrorService
}

// mirrorService holds the instances of one service. The list it points to
// is never modified once stored.
type mirrorService struct {
	name string                       // the one copy of the service's name its entries share
	ids  atomic.Pointer[instanceList] // by instance ID
}

func newMirrorService(name string, ids instanceList) *mirrorService {
	s := &mirrorService{name: name}
	s.ids.Store(&ids)
	return s
}

// instances returns the instances of service (nil for none); the list must
// not be modified.
func (st *mirrorState) instances(service string) instanceList {
	if s := st.services[service]; s != nil {
		return *s.ids.Load()
	}
	return nil
}

// instanceList is a service's entries sorted by instance ID (each entry's
// rec.srv.ID), searched by binary search: 8 bytes an instance, where a map by
// ID took about 30 (docs/perf/memory.md, "What keeps it down"). A list is
// never modified once stored: with and without return copies.
type instanceList []*mirrorEntry

// listOf returns the entries of ids as a list.
func listOf(ids map[string]*mirrorEntry) instanceList {
	l := make(instanceList, 0, len(ids))
	for _, e := range ids {
		l = append(l, e)
	}
	slices.SortFunc(l, func(a, b *mirrorEntry) int { return strings.Compare(a.rec.srv.ID, b.rec.srv.ID) })
	return l
}

// search returns where id is or would be, and whether it is there.
func (l instanceList) search(id string) (int, bool) {
	return slices.BinarySearchFunc(l, id, func(e *mirrorEntry, id string) int { return strings.Compare(e.rec.srv.ID, id) })
}

// find returns the entry of id, or nil.
func (l instanceList) find(id string) *mirrorEntry {
	if i, ok := l.search(id); ok {
		return l[i]
	}
	return nil
}

// findBytes is find of string(id), without converting it. The search is
// written out: through slices.BinarySearchFunc, whose comparison is a
// call through a func value, id escapes, and a refresh would allocate
// (TestMirrorRefreshCostsNothing).
func (l instanceList) findBytes(id []byte) *mirrorEntry {
	lo, hi := 0, len(l)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		switch c := compareBytes(l[mid].rec.srv.ID, id); {
		case c == 0:
			return l[mid]
		case c < 0:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return nil
}

// compareBytes is strings.Compare(s, string(b)).
func compareBytes(s string, b []byte) int {
	for i := range min(len(s), len(b)) {
		if s[i] != b[i] {
			if s[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return cmp.Compare(len(s), len(b))
}

// with returns a copy of l with e in the place of its ID.
func (l instanceList) with(e *mirrorEntry) instanceList {
	i, ok := l.search(e.rec.srv.ID)
	if ok {
		out := slices.Clone(l)
		out[i] = e
		return out
	}
	out := make(instanceList, 0, len(l)+1)
	out = append(out, l[:i]...)
	out = append(out, e)
	return append(out, l[i:]...)
}

// without returns a copy of l without id's entry.
func (l instanceList) without(id string) instanceList {
	i, ok := l.search(id)
	if !ok {
		return l
	}
	out := make(instanceList, 0, len(l)-1)
	out = append(out, l[:i]...)
	return append(out, l[i+1:]...)
}

// mirrorEntry is one instance and the revision of its last put. The
// instance never changes once stored; the revision does (a refresh), which
// is why it is atomic: a refresh then costs no copy of the state.
type mirrorEntry struct {
	rec record // mirror_compact.go
	rev atomic.Uint64
	// sum is the keyed hash of the value the last put stored (see
	// valueSum), so that a refresh (the same bytes again) is told from a
	// change without decoding. Only the mirror's goroutine reads or writes
	// it: readers never see it.
	sum valueSum
}

// valueSum is a 64-bit keyed hash of a registry value: a maphash sum with
// a seed drawn at random for each mirror. It stands for the value's bytes,
// which a mirror of 100,000 instances would otherwise keep at some 130
// bytes each (measured: 12.5 MB more live heap, 27 MB more resident memory
// at that size), to recognise a lease refresh. A change whose sum is the
// one before (a 2^-64 chance for values nobody chose: once in some 10^10
// years at 10,000 changes a second; a publisher cannot aim for it without
// the gateway's seed) would make the mirror keep that key's previous value
// until its next change, which only the key's own publisher could cause
// and which it could have by writing nothing. 64 bits, not 128: the entry
// then takes 32 bytes instead of 48 (1.6 MB at 100,000 instances).
type valueSum uint64

func (m *Mirror) valueSum(value []byte) valueSum {
	return valueSum(maphash.Bytes(m.seed, value))
}

func (e *mirrorEntry) entry(service string) Entry {
	return Entry{Instance: e.instance(service), Revision: e.rev.Load()}
}

// heldEntry returns the entry the mirror holds for service/id, nil for
// none.
func (m *Mirror) heldEntry(service, id string) *mirrorEntry {
	if svc := m.state.Load().services[service]; svc != nil {
		return svc.ids.Load().find(id)
	}
	return nil
}

// Server returns the server of the instance service/id if the mirror
// holds it: the mirror's own, which a balancer may keep as its copy
// (balancer.SetServersShared) and nobody modifies.
func (m *Mirror) Server(service, id string) (*balancer.Server, bool) {
	e := m.heldEntry(service, id)
	if e == nil {
		return nil, false
	}
	return e.rec.srv, true
}

// Get returns the instance service/id if the mirror holds it.
func (m *Mirror) Get(service, id string) (Instance, bool) {
	svc := m.state.Load().services[service]
	if svc == nil {
		return Instance{}, false
	}
	e := svc.ids.Load().find(id)
	if e == nil {
		return Instance{}, false
	}
	return e.instance(svc.name), true
}

// Entry is Get with the revision of the instance's last put (see
// MirrorStats.Revision on how revisions stay ordered across a recreated
// bucket).
func (m *Mirror) Entry(service, id string) (Entry, bool) {
	svc := m.state.Load().services[service]
	if svc == nil {
		return Entry{}, false
	}
	e := svc.ids.Load().find(id)
	if e == nil {
		return Entry{}, false
	}
	return e.entry(svc.name), true
}

// Service returns the instances of one service, sorted by instance ID.
func (m *Mirror) Service(service string) []Instance {
	svc := m.state.Load().services[service]
	if svc == nil {
		return []Instance{}
	}
	ids := *svc.ids.Load()
	out := make([]Instance, 0, len(ids))
	for _, e := range ids {
		out = append(out, e.instance(svc.name))
	}
	slices.SortFunc(out, compareInstances)
	return out
}

// Entries is Service with each instance's revision.
func (m *Mirror) Entries(service string) []Entry {
	svc := m.state.Load().services[service]
	if svc == nil {
		return []Entry{}
	}
	ids := *svc.ids.Load()
	out := make([]Entry, 0, len(ids))
	for _, e := range ids {
		out = append(out, e.entry(svc.name))
	}
	slices.SortFunc(out, func(a, b Entry) int { return compareInstances(a.Instance, b.Instance) })
	return out
}

// Version is what a reconciliation needs of an entry: its instance's
// incarnation and the revision of its last put.
type Version struct {
	Incarnation int64
	Revision    uint64
}

// Versions yields the ID and Version of every instance of service, in ID
// order, from one state of the service, without copying any record
// (Entries copies each, its metadata included, and sorts them).
func (m *Mirror) Versions(service string) iter.Seq2[string, Version] {
	ids := m.state.Load().instances(service)
	return func(yield func(string, Version) bool) {
		for _, e := range ids {
			if !yield(e.rec.srv.ID, Version{Incarnation: e.rec.srv.Incarnation, Revision: e.rev.Load()}) {
				return
			}
		}
	}
}

// Services returns the names of the services that have instances, sorted.
func (m *Mirror) Services() []string {
	out := slices.Collect(maps.Keys(m.state.Load().services))
	slices.Sort(out)
	return out
}
