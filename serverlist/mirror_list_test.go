package serverlist

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pushlb/pushlb/balancer"
)

// TestInstanceListUnderManyChanges: a service's entries, a list sorted by
// ID, find (by string and by bytes) exactly the IDs a map would hold after
// many random puts and removals, stay sorted, and each change leaves the
// list it copied as it was (readers may hold it).
func TestInstanceListUnderManyChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	var list instanceList
	want := map[string]*mirrorEntry{}
	for step := range 5000 {
		id := fmt.Sprintf("10.0.%d.%d:orders:%d", rng.IntN(4), rng.IntN(60), 8080+rng.IntN(2))
		before := slices.Clone(list)
		prev := list
		if rng.IntN(3) == 0 {
			list = list.without(id)
			delete(want, id)
		} else {
			e := &mirrorEntry{rec: record{srv: &balancer.Server{ID: id, Incarnation: int64(step)}}}
			list = list.with(e)
			want[id] = e
		}
		if !slices.Equal(prev, before) {
			t.Fatalf("step %d: the change modified the list it copied", step)
		}
		if len(list) != len(want) || !slices.IsSortedFunc(list, func(a, b *mirrorEntry) int { return compareBytes(a.rec.srv.ID, []byte(b.rec.srv.ID)) }) {
			t.Fatalf("step %d: %d entries (want %d), sorted %v", step, len(list), len(want), slices.IsSortedFunc(list, func(a, b *mirrorEntry) int { return compareBytes(a.rec.srv.ID, []byte(b.rec.srv.ID)) }))
		}
		for _, probe := range []string{id, id + "x", id[:len(id)-1], ""} {
			if got, w := list.find(probe), want[probe]; got != w {
				t.Fatalf("step %d: find(%q) = %v, want %v", step, probe, got, w)
			}
			if got, w := list.findBytes([]byte(probe)), want[probe]; got != w {
				t.Fatalf("step %d: findBytes(%q) = %v, want %v", step, probe, got, w)
			}
		}
	}
	if got := listOf(want); !slices.Equal(got, list) {
		t.Fatal("listOf of the same entries is another list")
	}
}
