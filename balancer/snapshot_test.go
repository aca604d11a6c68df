package balancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestSnapshotListsUnderMarks: across random lists and down-marks, in one
// zone and in three, a snapshot's alive list is every listed server up, in
// list order, each zone's list its servers of that zone, and the lists
// share one backing array where they hold the same servers (every server
// up: the alive list is the list; one zone: its list is the alive list),
// which saves 8 bytes a server for each (docs/perf/memory.md); a down-mark never
// writes into the list it shared.
func TestSnapshotListsUnderMarks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for _, zones := range [][]string{{"a"}, {"a", "B", "c"}} {
		t.Run(fmt.Sprintf("zones=%d", len(zones)), func(t *testing.T) {
			tb := newTest(t, nil, nil)
			for round := range 200 {
				var in []Server
				for _, i := range rng.Perm(60)[:1+rng.IntN(59)] {
					in = append(in, Server{ID: fmt.Sprint("s", i), Host: "10.0.0.1", Port: 1000 + i, Zone: zones[i%len(zones)]})
				}
				if err := tb.SetServers(in); err != nil {
					t.Fatal(err)
				}
				listed := slices.Clone(tb.Snapshot().All())
				down := map[string]bool{} // marked down this round
				if round%4 != 0 {
					for range rng.IntN(len(in)) {
						down[in[rng.IntN(len(in))].ID] = true
					}
					marks := map[string]bool{}
					for id := range down {
						marks[id] = false
					}
					for range rng.IntN(3) { // and some back up
						marks[in[rng.IntN(len(in))].ID] = true
					}
					tb.MarkServers(marks)
				}
				snap := tb.Snapshot()
				if !slices.Equal(snap.All(), listed) {
					t.Fatalf("round %d: a down-mark changed the list", round)
				}
				var want []*Server
				wantZone := map[string][]*Server{}
				for _, s := range listed {
					if s.Alive() { // a mark stays while the server stays listed
						want = append(want, s)
						wantZone[strings.ToLower(s.Zone)] = append(wantZone[strings.ToLower(s.Zone)], s)
					}
				}
				if !slices.Equal(snap.Reachable(), want) {
					t.Fatalf("round %d: alive %v, want %v", round, snap.Reachable(), want)
				}
				if got := snap.Zones(); len(got) != len(wantZone) {
					t.Fatalf("round %d: zones %q, want %d", round, got, len(wantZone))
				}
				for z, w := range wantZone {
					if v := snap.Zone(z); v == nil || !slices.Equal(v.Servers(), w) {
						t.Fatalf("round %d: zone %q lists %v, want %v", round, z, v, w)
					}
				}
				if len(want) == len(listed) && !sameArray(snap.Reachable(), snap.All()) {
					t.Fatalf("round %d: every server up, and the alive list is a copy", round)
				}
				for z := range wantZone {
					if len(wantZone) == 1 && !sameArray(snap.Zone(z).Servers(), snap.Reachable()) {
						t.Fatalf("round %d: one zone, and its list is a copy", round)
					}
				}
			}
		})
	}
}
