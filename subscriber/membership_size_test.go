package subscriber

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// instanceIDs returns perService instance IDs for each of n services, as
// the mirror holds them (the table's keys share their bytes).
func instanceIDs(n, perService int) (names []string, ids [][]string) {
	names = make([]string, n)
	ids = make([][]string, n)
	for s := range names {
		names[s] = fmt.Sprintf("service-%06d", s)
		ids[s] = make([]string, perService)
		for i := range ids[s] {
			ids[s][i] = fmt.Sprintf("10.%d.%d.%d:%s:8080", i>>16, i>>8&0xff, i&0xff, names[s])
		}
	}
	return names, ids
}

// heapAlloc returns the bytes of live heap after a collection (two: the
// first only moves sync.Pools' contents to their victim caches).
func heapAlloc() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// tableBytesPerInstance builds a table of services x perService members
// the registry added (registered, as a gateway's start does: a
// reconciliation reserves each service's list first; without reserve, as
// one change after another grows it) and returns the heap it takes per
// instance: its lists, maps and members, not the IDs' bytes.
func tableBytesPerInstance(services, perService int, reserve bool) float64 {
	names, ids := instanceIDs(services, perService)
	now := time.Now()
	before := heapAlloc()
	m := newMembership()
	rev := uint64(0)
	for s, svc := range names {
		if reserve {
			m.reserve(svc, perService)
		}
		for _, id := range ids[s] {
			rev++
			m.registered(svc, id, 1, rev, now)
		}
	}
	after := heapAlloc()
	runtime.KeepAlive(m)
	runtime.KeepAlive(ids)
	return float64(after-before) / float64(services*perService)
}

// BenchmarkTableBytes reports the membership table's bytes per instance
// of a fleet of 100,000 instances, at 100, 1,000 and 10,000 instances per
// service, its lists reserved as a start's reconciliations do them and
// grown one member at a time (the figures of member's comment).
func BenchmarkTableBytes(b *testing.B) {
	for _, perService := range []int{100, 1000, 10000} {
		for _, reserve := range []bool{true, false} {
			b.Run(fmt.Sprintf("perService=%d/reserved=%v", perService, reserve), func(b *testing.B) {
				var bytes float64
				for b.Loop() {
					bytes = tableBytesPerInstance(100_000/perService, perService, reserve)
				}
				b.ReportMetric(bytes, "bytes/instance")
			})
		}
	}
}

// TestTableBytes: a live member the registry confirmed costs its 32-byte
// slot in its service's sorted list: about 35 bytes an instance, its
// service's share included, when a reconciliation reserved the list (a
// gateway's start), at most about 50 when changes grew it one at a time
// (append's room); 53 at 100 a service and 71 at 1,000 when the lists
// were maps of 16-byte members.
func TestTableBytes(t *testing.T) {
	for _, c := range []struct {
		services, perService int
		reserve              bool
		max                  float64
	}{{200, 100, true, 38}, {20, 1000, true, 36}, {200, 100, false, 52}, {20, 1000, false, 45}} {
		got := tableBytesPerInstance(c.services, c.perService, c.reserve)
		t.Logf("%.1f bytes per instance at %d per service, reserved %v", got, c.perService, c.reserve)
		if got > c.max {
			t.Errorf("the table takes %.1f bytes per instance at %d per service (reserved %v), want at most %.0f", got, c.perService, c.reserve, c.max)
		}
	}
}

// TestExpireShrinksMaps: after a flood of announcements nobody registered,
// in a known service and in as many invented ones, expire returns the
// table to its idle size: it copies the maps that shrank a lot (a
// service's members, its extras, the services).
func TestExpireShrinksMaps(t *testing.T) {
	const flood = 5000
	names, ids := instanceIDs(1, 100+flood)
	invented := make([]string, flood)
	for i := range invented {
		invented[i] = fmt.Sprintf("invented-%06d", i)
	}
	svc := names[0]
	m := newMembership()
	t0 := m.epoch
	before := heapAlloc()
	for i, id := range ids[0][:100] {
		m.registered(svc, id, 1, uint64(i+1), t0)
		if i%2 == 0 { // tombstones: members with extras that stay
			m.event(svc, id, 1, false, fromEvent, uint64(i+1), t0)
		}
	}
	idle := heapAlloc() - before
	for i, id := range ids[0][100:] {
		m.event(svc, id, 1, i%2 == 0, fromEvent, 200, t0)
		m.event(invented[i], id, 1, true, fromEvent, 200, t0)
	}
	flooded := heapAlloc() - before
	if _, dropped := m.expire(t0.Add(time.Second)); dropped != 2*flood {
		t.Fatalf("expire dropped %d, want %d", dropped, 2*flood)
	}
	after := heapAlloc() - before
	runtime.KeepAlive(m)
	runtime.KeepAlive(ids)
	runtime.KeepAlive(invented)
	t.Logf("%d bytes idle, %d during the flood, %d after", idle, flooded, after)
	if sm := m.services[svc]; len(m.services) != 1 || len(sm.ids) != 100 || len(sm.extra) != 50 {
		t.Fatalf("after expire: %d services, %d members, %d extras; want 1, 100, 50", len(m.services), len(sm.ids), len(sm.extra))
	}
	if after > idle+idle/2 {
		t.Errorf("the table takes %d bytes after a flood expired (%d during it), %d idle", after, flooded, idle)
	}
}
