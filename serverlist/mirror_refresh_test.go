package serverlist

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
)

// fakeEntry is a watch update built in memory, so that the mirror's apply
// path is measured without NATS.
type fakeEntry struct {
	key string
	val []byte
	rev uint64
	op  jetstream.KeyValueOp
}

func (e *fakeEntry) Bucket() string                  { return "test" }
func (e *fakeEntry) Key() string                     { return e.key }
func (e *fakeEntry) Value() []byte                   { return e.val }
func (e *fakeEntry) Revision() uint64                { return e.rev }
func (e *fakeEntry) Created() time.Time              { return time.Time{} }
func (e *fakeEntry) Delta() uint64                   { return 0 }
func (e *fakeEntry) Operation() jetstream.KeyValueOp { return e.op }

var _ jetstream.KeyValueEntry = (*fakeEntry)(nil)

// refreshFleet returns services x perService entries as a registry holds
// them (instances as a publisher encodes them), and the mirror synced on
// them.
func refreshFleet(tb testing.TB, services, perService int, cfg MirrorConfig) (*Mirror, []*fakeEntry) {
	tb.Helper()
	m := NewMirror(nil, cfg)
	fresh := make(map[string]map[string]*mirrorEntry)
	var ents []*fakeEntry
	for s := range services {
		for i := range perService {
			in := Instance{
				Service: fmt.Sprintf("svc-%d", s), InstanceID: fmt.Sprintf("svc-%d-i%d-g0", s, i),
				Host: fmt.Sprintf("10.0.%d.%d", s%256, i%256), Port: 8000, Zone: "a",
				Metadata: map[string]string{"version": "1.2.3"}, Incarnation: time.Now().UnixNano(),
				Owner: "3f9c0a7e5b1d2c4e",
			}
			key, val, err := encodeInstance(in)
			if err != nil {
				tb.Fatal(err)
			}
			e := &fakeEntry{key: key, val: val, rev: uint64(len(ents) + 1)}
			ents = append(ents, e)
			m.applyFresh(fresh, map[string]struct{}{}, e, e.rev)
		}
	}
	m.swap(fresh, uint64(len(ents)))
	return m, ents
}

// refreshOf returns a put of e's key with a copy of its value (as NATS
// delivers it: a buffer of its own) at revision rev.
func refreshOf(e *fakeEntry, rev uint64) *fakeEntry {
	return &fakeEntry{key: e.key, val: append([]byte(nil), e.val...), rev: rev}
}

// BenchmarkMirrorRefresh: one lease refresh (a put whose value is unchanged)
// through the mirror's apply path, with an OnRefresh callback, over a
// mirror of 1,000 services x 100 instances (docs/perf.md's fleet), each
// refresh another instance's. The entries are built before the timer: what
// is left is what the mirror spends per refresh beyond NATS's own decoding.
// The "changed" case (a new incarnation: decode, validation, copy of the
// service's map, OnChange) is there for comparison.
func BenchmarkMirrorRefresh(b *testing.B) {
	for _, tc := range []struct {
		name    string
		changed bool
	}{{"unchanged", false}, {"changed", true}} {
		b.Run(tc.name, func(b *testing.B) {
			var calls int
			m, ents := refreshFleet(b, 1000, 100, MirrorConfig{
				OnRefresh: func(string, string, int64, uint64) { calls++ },
				OnChange:  func(string) { calls++ },
			})
			// Pools of updates to cycle through, built before the timer: a
			// change alternates between two values of every instance.
			pools := [][]*fakeEntry{make([]*fakeEntry, len(ents))}
			if tc.changed {
				pools = append(pools, make([]*fakeEntry, len(ents)))
			}
			for i, e := range ents {
				pools[0][i] = refreshOf(e, 0)
				if tc.changed {
					var in Instance
					if err := json.Unmarshal(e.val, &in); err != nil {
						b.Fatal(err)
					}
					in.Incarnation++
					u := refreshOf(e, 0)
					_, u.val, _ = encodeInstance(in)
					pools[0][i], pools[1][i] = u, pools[0][i]
				}
			}
			rev := uint64(len(ents))
			b.ReportAllocs()
			i, pass := 0, 0
			for b.Loop() {
				rev++
				u := pools[pass%len(pools)][i]
				u.rev = rev
				m.apply(u, rev, nil)
				if i++; i == len(ents) {
					i, pass = 0, pass+1
				}
			}
			if calls == 0 {
				b.Fatal("no callback ran")
			}
		})
	}
}

// TestMirrorRefreshCostsNothing: refreshes (the stored bytes put again)
// update each entry's revision and call OnRefresh, and do nothing else: no
// OnChange, no new state, no allocation. The same instance in other bytes
// is a refresh too, found by decoding; a changed value is a change.
func TestMirrorRefreshCostsNothing(t *testing.T) {
	if want := keyEncoding.EncodedLen(events.MaxInstanceIDLength); maxEncodedID != want {
		t.Fatalf("maxEncodedID = %d, want %d", maxEncodedID, want)
	}
	var changes, refreshes int
	var lastRev uint64
	m, ents := refreshFleet(t, 10, 10, MirrorConfig{
		OnChange: func(string) { changes++ },
		OnRefresh: func(service, id string, inc int64, rev uint64) {
			refreshes++
			lastRev = rev
		},
	})
	changes = 0 // the initial sync's
	state := snapshot(m)
	puts := m.Stats().Puts
	rev := uint64(len(ents))
	const rounds = 5
	for range rounds {
		for _, e := range ents {
			rev++
			m.apply(refreshOf(e, rev), rev, nil)
			if got, _ := m.Entry(decodedService(t, e.key), idOfKey(t, e.key)); got.Revision != rev || lastRev != rev {
				t.Fatalf("after a refresh at %d: entry revision %d, OnRefresh revision %d", rev, got.Revision, lastRev)
			}
		}
	}
	st := m.Stats()
	if n := rounds * len(ents); changes != 0 || refreshes != n || st.Refreshes != uint64(n) || st.Puts-puts != uint64(n) {
		t.Fatalf("%d refreshes: %d OnChange, %d OnRefresh, Stats %+v", n, changes, refreshes, st)
	}
	if !slices.Equal(snapshot(m), state) {
		t.Fatal("a refresh replaced a part of the mirror's state")
	}
	u := refreshOf(ents[0], 0)
	if a := testing.AllocsPerRun(1000, func() { rev++; u.rev = rev; m.apply(u, rev, nil) }); a != 0 {
		t.Fatalf("a refresh allocates %.1f times", a)
	}

	// The same instance encoded otherwise (fields in another order): a
	// refresh, found by decoding; the next one with these bytes is cheap.
	var b Instance
	if err := json.Unmarshal(ents[1].val, &b); err != nil {
		t.Fatal(err)
	}
	other := fmt.Appendf(nil, `{"zone":%q,"port":%d,"host":%q,"instanceId":%q,"service":%q,"incarnation":%d,"metadata":{"version":"1.2.3"},"owner":%q}`,
		b.Zone, b.Port, b.Host, b.InstanceID, b.Service, b.Incarnation, b.Owner)
	var a Instance
	if err := json.Unmarshal(other, &a); err != nil {
		t.Fatal(err)
	}
	if !a.Equal(b) {
		t.Fatalf("test bug: %s is not %s", other, ents[1].val)
	}
	u = &fakeEntry{key: ents[1].key, val: other}
	rev++
	m.apply(u, rev, nil)
	if changes != 0 || !slices.Equal(snapshot(m), state) {
		t.Fatalf("the same instance in other bytes was a change (%d OnChange)", changes)
	}
	if a := testing.AllocsPerRun(1000, func() { rev++; u.rev = rev; m.apply(u, rev, nil) }); a != 0 {
		t.Fatalf("a refresh in the new bytes allocates %.1f times", a)
	}

	// A changed value is a change, and its bytes are the new reference.
	b.Incarnation++
	_, val, err := encodeInstance(b)
	if err != nil {
		t.Fatal(err)
	}
	rev++
	m.apply(&fakeEntry{key: ents[1].key, val: val, rev: rev}, rev, nil)
	if got, _ := m.Get(b.Service, b.InstanceID); changes != 1 || got.Incarnation != b.Incarnation {
		t.Fatalf("a new incarnation: %d OnChange, mirror holds %+v", changes, got)
	}
	before := refreshes
	rev++
	m.apply(&fakeEntry{key: ents[1].key, val: append([]byte(nil), val...), rev: rev}, rev, nil)
	if changes != 1 || refreshes != before+1 {
		t.Fatalf("a refresh of the new value: %d OnChange, %d OnRefresh", changes, refreshes-before)
	}
	// The value the entry held before is now a change again.
	rev++
	m.apply(refreshOf(ents[1], rev), rev, nil)
	if changes != 2 {
		t.Fatalf("the old value put back: %d OnChange, want 2", changes)
	}
}

// snapshot returns the mirror's state and each of its services' maps, in
// order of the services' names: what a change replaces.
func snapshot(m *Mirror) []any {
	st := m.state.Load()
	out := []any{st}
	for _, name := range slices.Sorted(maps.Keys(st.services)) {
		out = append(out, st.services[name].ids.Load())
	}
	return out
}

func decodedService(t *testing.T, key string) string {
	s, _, err := DecodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func idOfKey(t *testing.T, key string) string {
	_, id, err := DecodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
