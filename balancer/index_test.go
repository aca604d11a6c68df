package balancer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestIndexByIDUnderManyChanges: the index by ID (a sorted slice) finds
// every listed server and no other across many random list changes
// (servers added, removed, changed, reordered, listed twice, invalid),
// through SetServers, AddServers and MarkServerDown; the list keeps the
// caller's order with the first of duplicate IDs, a server that stays
// keeps its statistics, and each invalid or duplicate entry is reported
// in list order.
func TestIndexByIDUnderManyChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	tb := newTest(t, nil, nil)
	const universe = 300
	id := func(i int) string { return fmt.Sprintf("i-%03d:%d", i, i%7) } // IDs with ':' as Eureka's
	server := func(i int) Server {
		return Server{ID: id(i), Host: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Port: 8000 + rng.IntN(2), Zone: []string{"A", "b", ""}[i%3]}
	}
	stats := map[string]*ServerStats{}
	for round := range 400 {
		var in []Server
		for _, i := range rng.Perm(universe)[:rng.IntN(universe)] {
			in = append(in, server(i))
		}
		var wantErrs []string
		if len(in) > 0 && round%3 == 0 { // a duplicate of an earlier entry, and an invalid entry
			d := in[rng.IntN(len(in))]
			d.Port = 9999
			at := rng.IntN(len(in) + 1)
			in = slices.Insert(in, at, Server{ID: "bad", Port: 80})
			in = append(in, d)
			wantErrs = []string{`server "bad": empty host`, fmt.Sprintf("server %q: duplicate ID", d.ID)}
			if round%5 == 4 { // AddServers: the last of an ID replaces the others
				wantErrs = wantErrs[:1]
			}
		}
		if round%2 == 1 { // in ID order, as a registry lists them: the list is its own index
			slices.SortStableFunc(in, func(a, b Server) int { return strings.Compare(a.ID, b.ID) })
		}
		var err error
		if round%5 == 4 {
			err = tb.AddServers(in...)
		} else {
			err = tb.SetServers(in)
		}
		if (err != nil) != (wantErrs != nil) {
			t.Fatalf("round %d: err %v, want errors %q", round, err, wantErrs)
		}
		if err != nil {
			msg := err.Error()
			at := -1
			for _, w := range wantErrs {
				i := strings.Index(msg, w)
				if i <= at {
					t.Fatalf("round %d: error %q, want %q in this order", round, msg, wantErrs)
				}
				at = i
			}
		}
		var got []string
		for _, s := range tb.AllServers() {
			got = append(got, s.ID)
		}
		// The expected list: the caller's order, the first of each ID
		// (AddServers: the list as it is, its order tested elsewhere).
		var want []string
		seen := map[string]bool{}
		if round%5 == 4 {
			want = got
			for _, id := range got {
				seen[id] = true
			}
		}
		for _, s := range in {
			if round%5 != 4 && s.Host != "" && !seen[s.ID] {
				seen[s.ID] = true
				want = append(want, s.ID)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: list %v, want %v", round, got, want)
		}
		all := tb.AllServers()
		sorted := slices.IsSortedFunc(all, func(a, b *Server) int { return strings.Compare(a.ID, b.ID) })
		if shared := sameArray(all, tb.byID); shared && !sorted || !shared && sorted && err == nil && round%5 != 4 && len(all) > 0 {
			t.Fatalf("round %d: the index shares the list: %v; the list in ID order: %v", round, shared, sorted)
		}
		for i := range universe {
			s := tb.Server(id(i))
			if seen[id(i)] != (s != nil) || s != nil && s.ID != id(i) {
				t.Fatalf("round %d: Server(%q) = %v, listed %v", round, id(i), s, seen[id(i)])
			}
			if s == nil {
				delete(stats, id(i))
				continue
			}
			if prev, ok := stats[id(i)]; ok && prev != s.Stats() {
				t.Fatalf("round %d: %s lost its statistics", round, id(i))
			}
			stats[id(i)] = s.Stats()
			if tb.ServerStats(id(i)) != s.Stats() {
				t.Fatalf("round %d: ServerStats(%q) is not the listed server's", round, id(i))
			}
			if wantZone := strings.ToLower(s.Zone); s.zoneKey() != wantZone {
				t.Fatalf("round %d: %s zone key %q, want %q", round, s.ID, s.zoneKey(), wantZone)
			}
		}
		if len(want) > 0 {
			down := want[rng.IntN(len(want))]
			if !tb.MarkServerDown(down) || tb.Server(down).Alive() {
				t.Fatalf("round %d: MarkServerDown(%q) missed it", round, down)
			}
		}
		if tb.Server("absent") != nil || tb.MarkServerDown("absent") {
			t.Fatalf("round %d: an unlisted ID found", round)
		}
	}
}
