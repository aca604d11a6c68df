package balancer

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// owners maps each of keys to the ID of its server under tb's rule.
func owners(t testing.TB, tb *testBalancer, keys []string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		s, err := tb.Choose(WithKey(t.Context(), k))
		if err != nil {
			t.Fatal(err)
		}
		out[k] = s.ID
	}
	return out
}

func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	return keys
}

// without returns list less the server with this ID.
func without(list []Server, id string) []Server {
	var out []Server
	for _, s := range list {
		if s.ID != id {
			out = append(out, s)
		}
	}
	return out
}

// moved counts the keys whose owner differs, and among them those whose
// owner is still listed in after (moved for no reason of their own).
func moved(before, after map[string]string, gone string) (all, others int) {
	for k, was := range before {
		if after[k] != was {
			all++
			if was != gone {
				others++
			}
		}
	}
	return all, others
}

// Removing one of N servers moves its keys (1/N of them) and, Maglev's
// price for an even spread and O(1) lookups, a few others. The bound: at
// most 1 % of all keys besides the removed server's move (measured: 0.0 %
// at N=3, 0.2 % at N=10, 0.6 % at N=100 and N=1,000), so at N=10 at most
// 11 %.
func TestMaglevKeyMovementOnRemoval(t *testing.T) {
	keys := testKeys(10000)
	for _, n := range []int{3, 10, 100, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			list := servers(n, "", 0)
			tb := oneZone(t, RuleMaglev, n)
			before := owners(t, tb, keys)
			gone := fmt.Sprintf("s%d", n/2)
			if err := tb.SetServers(without(list, gone)); err != nil {
				t.Fatal(err)
			}
			after := owners(t, tb, keys)
			all, others := moved(before, after, gone)
			share := 1 / float64(n)
			t.Logf("N=%d: %d of %d keys moved (%.2f%%, 1/N = %.2f%%); %d not of the removed server (%.2f%% of theirs)",
				n, all, len(keys), 100*float64(all)/float64(len(keys)), 100*share, others,
				100*float64(others)/(float64(len(keys))*(1-share)))
			if float64(others) > 0.01*float64(len(keys)) {
				t.Errorf("%d keys of servers that stayed moved, more than 1%% of all", others)
			}
			if n == 10 && all > 1100 {
				t.Errorf("%d keys moved at N=10, more than 11%%", all)
			}
			for k, was := range before {
				if was == gone && after[k] == gone {
					t.Fatalf("key %s still on the removed server", k)
				}
			}
			// The server coming back takes its keys back.
			if err := tb.SetServers(list); err != nil {
				t.Fatal(err)
			}
			back := owners(t, tb, keys)
			for k, was := range before {
				if back[k] != was {
					t.Fatalf("key %s: %s before, %s after the server came back", k, was, back[k])
				}
			}
		})
	}
}

func TestMaglevKeyMovementOnAddition(t *testing.T) {
	keys := testKeys(10000)
	tb := oneZone(t, RuleMaglev, 10)
	before := owners(t, tb, keys)
	if err := tb.SetServers(servers(11, "", 0)); err != nil {
		t.Fatal(err)
	}
	after := owners(t, tb, keys)
	all, _ := moved(before, after, "")
	toNew := 0
	for k := range before {
		if after[k] == "s10" {
			toNew++
		}
	}
	t.Logf("10 -> 11 servers: %d keys moved, %d of them to the new server", all, toNew)
	if all > 1100 || float64(all-toNew) > 0.01*float64(len(keys)) {
		t.Errorf("%d keys moved, %d of them between servers that stayed", all, all-toNew)
	}
}

// Keys spread evenly: every server owns floor or ceil of M/N slots, so
// keys divide as evenly as their hashes allow.
func TestMaglevSpreadsKeysEvenly(t *testing.T) {
	for _, n := range []int{3, 10, 100, 1000, 10000} {
		list := make([]*Server, n)
		for i := range list {
			list[i] = &Server{ID: fmt.Sprintf("i-%d", i)}
		}
		tab := buildMaglev(list)
		m := int(tab.m)
		owned := make([]int, n)
		for slot := range tab.m {
			owned[tab.at(slot)]++
		}
		lo, hi := m/n, (m+n-1)/n
		for i, c := range owned {
			if c < lo || c > hi {
				t.Fatalf("N=%d M=%d: server %d owns %d slots, want %d or %d", n, m, i, c, lo, hi)
			}
		}
		if n <= 100 && m < 100*n {
			t.Errorf("N=%d: table of %d slots, want at least 100 per server", n, m)
		}
	}
	for _, m := range maglevSizes {
		if !isPrime(m) {
			t.Errorf("table size %d is not a prime", m)
		}
	}

	const n, k = 10, 20000
	tb := oneZone(t, RuleMaglev, n)
	counts := map[string]int{}
	for _, owner := range owners(t, tb, testKeys(k)) {
		counts[owner]++
	}
	checkUniform(t, counts, idRange(0, n), k, 0.1)
}

// The table depends on the servers' IDs, not on the list's order: every
// gateway sends a key to the same server.
func TestMaglevIgnoresListOrder(t *testing.T) {
	keys := testKeys(2000)
	list := servers(50, "", 0)
	a := owners(t, oneZone(t, RuleMaglev, 50), keys)
	shuffled := append([]Server(nil), list...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	tb := oneZone(t, RuleMaglev, 0)
	if err := tb.SetServers(shuffled); err != nil {
		t.Fatal(err)
	}
	b := owners(t, tb, keys)
	for _, k := range keys {
		if a[k] != b[k] {
			t.Fatalf("key %s: %s in list order, %s shuffled", k, a[k], b[k])
		}
	}
}

// A key whose server is tripped goes to the next slot's server while it
// is; no other key moves; the keys come back when the breaker closes. A
// server marked down leaves the table.
func TestMaglevTrippedAndDownServers(t *testing.T) {
	keys := testKeys(5000)
	tb := oneZone(t, RuleMaglev, 10)
	before := owners(t, tb, keys)

	tb.trip(t, "s4")
	during := owners(t, tb, keys)
	spread := map[string]int{}
	for k, was := range before {
		switch {
		case was == "s4":
			if during[k] == "s4" {
				t.Fatalf("key %s stayed on tripped s4", k)
			}
			spread[during[k]]++
		case during[k] != was:
			t.Fatalf("key %s moved from %s, not tripped, to %s", k, was, during[k])
		}
	}
	if len(spread) < 8 {
		t.Errorf("s4's keys went to %d servers only: %v", len(spread), spread)
	}
	// Two tripped: still only their keys move.
	tb.trip(t, "s7")
	for k, now := range owners(t, tb, keys) {
		if now == "s4" || now == "s7" || (before[k] != "s4" && before[k] != "s7" && now != before[k]) {
			t.Fatalf("key %s: %s before, %s with s4 and s7 tripped", k, before[k], now)
		}
	}
	tb.ServerStats("s4").responseReceived(0)
	tb.ServerStats("s7").responseReceived(0)
	for k, now := range owners(t, tb, keys) {
		if now != before[k] {
			t.Fatalf("key %s did not come back: %s, was %s", k, now, before[k])
		}
	}

	// Every server tripped: a key keeps its own.
	tb.trip(t, idRange(0, 10)...)
	for k, now := range owners(t, tb, keys[:200]) {
		if now != before[k] {
			t.Fatalf("all tripped: key %s went to %s, not its own %s", k, now, before[k])
		}
	}
	tb.clock.Advance(tb.cfg.Breaker.Max)

	tb.MarkServerDown("s2")
	for k, now := range owners(t, tb, keys) {
		if now == "s2" {
			t.Fatalf("key %s on s2, marked down", k)
		}
	}
	tb.MarkServerUp("s2")
	for k, now := range owners(t, tb, keys) {
		if now != before[k] {
			t.Fatalf("key %s: %s after s2 came back up, was %s", k, now, before[k])
		}
	}
}

// Without a key, Maglev is round robin.
func TestMaglevWithoutKeyIsRoundRobin(t *testing.T) {
	tb := oneZone(t, RuleMaglev, 4)
	checkUniform(t, tb.pickCounts(t, 400), idRange(0, 4), 400, 0)
}

// A zone's view (WithZone) gets its own table, built by its first keyed
// pick: a key stays in the zone and keeps its server there.
func TestMaglevInAZone(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleMaglev }, zoned(5, "a", "b"))
	keys := testKeys(500)
	first := map[string]string{}
	for range 2 {
		for _, k := range keys {
			s, err := tb.Choose(WithKey(WithZone(t.Context(), "b"), k))
			if err != nil || s.Zone != "b" {
				t.Fatalf("got %v, %v; want a server of zone b", s, err)
			}
			if was, ok := first[k]; ok && was != s.ID {
				t.Fatalf("key %s: %s then %s", k, was, s.ID)
			}
			first[k] = s.ID
		}
	}
}

// The configured name Rendezvous builds Maglev; both names are accepted.
func TestRendezvousNameBuildsMaglev(t *testing.T) {
	cfg := DefaultConfig()
	for _, name := range []string{RuleRendezvous, "rendezvousRule", RuleMaglev, "maglev"} {
		r, err := NewRule(name, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := r.(*Maglev); !ok {
			t.Errorf("NewRule(%q) = %T, want *Maglev", name, r)
		}
	}
	if r, err := NewRule("leastrequest", &cfg); err != nil {
		t.Fatal(err)
	} else if _, ok := r.(*LeastRequest); !ok {
		t.Errorf("NewRule(leastrequest) = %T", r)
	}
	for _, name := range []string{RuleRendezvous, RuleMaglev, RuleLeastRequest} {
		if got, err := CanonicalRule(name); err != nil || got != name {
			t.Errorf("CanonicalRule(%q) = %q, %v", name, got, err)
		}
	}
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// buildMaglevReference is the textbook population buildMaglevSize must
// match slot for slot: servers sorted by hash then ID with a comparison
// sort, each probing its permutation one slot at a time.
func buildMaglevReference(servers []*Server, m int) []int32 {
	type perm struct {
		h          uint64
		idx        int32
		next, skip uint64
	}
	ps := make([]perm, len(servers))
	for i, s := range servers {
		ps[i] = perm{h: fnv64(s.ID), idx: int32(i)}
	}
	slices.SortFunc(ps, func(a, b perm) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(servers[a.idx].ID, servers[b.idx].ID)
	})
	for i := range ps {
		ps[i].next = mix64(ps[i].h^0x9e3779b97f4a7c15) % uint64(m)
		ps[i].skip = mix64(ps[i].h^0xc2b2ae3d27d4eb4f)%uint64(m-1) + 1
	}
	table := make([]int32, m)
	for i := range table {
		table[i] = -1
	}
	for filled := 0; filled < m; {
		for i := range ps {
			p := &ps[i]
			for table[p.next] >= 0 {
				p.next = (p.next + p.skip) % uint64(m)
			}
			table[p.next] = p.idx
			p.next = (p.next + p.skip) % uint64(m)
			if filled++; filled == m {
				break
			}
		}
	}
	return table
}

// TestMaglevBuildMatchesReference checks that the optimised build (radix
// sort, branchless probing, 16- and 32-bit tables) gives the textbook
// table, so that gateways running either agree on every key.
func TestMaglevBuildMatchesReference(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 255, 256, 1000, 10_000, 70_000} {
		if n > 10_000 && testing.Short() {
			continue
		}
		servers := make([]*Server, n)
		for i := range servers {
			servers[i] = &Server{ID: fmt.Sprintf("10.0.%d.%d:8080", i/256, i%256)}
		}
		// Shuffled: neither build may depend on the list's order.
		rand.New(rand.NewPCG(1, uint64(n))).Shuffle(n, func(i, j int) { servers[i], servers[j] = servers[j], servers[i] })
		m := maglevSize(n)
		got, want := buildMaglevSize(servers, m), buildMaglevReference(servers, m)
		for slot := range m {
			if g := got.at(uint64(slot)); int32(g) != want[slot] {
				t.Fatalf("N=%d M=%d slot %d: server %d, want %d", n, m, slot, g, want[slot])
			}
		}
	}
}

// TestWrapMaglev checks the branchless mod at its edges.
func TestWrapMaglev(t *testing.T) {
	for _, m := range []uint32{2, 65537, 6553621} {
		for _, c := range []uint32{0, 1, m - 1, m, m + 1, 2*m - 1} {
			if got := wrapMaglev(c, m); got != c%m {
				t.Errorf("wrapMaglev(%d, %d) = %d, want %d", c, m, got, c%m)
			}
		}
	}
}
