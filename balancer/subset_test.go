package balancer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// versioned returns servers "<version>-<zone><i>" with metadata version
// and, for hinted ones, hint.
func versioned(version, hint string, count int, zones ...string) []Server {
	var out []Server
	for zi, z := range zones {
		for i := range count {
			md := map[string]string{"version": version}
			if hint != "" {
				md[HintKey] = hint
			}
			out = append(out, Server{
				ID:   fmt.Sprintf("%s-%s%d", version, z, i),
				Host: fmt.Sprintf("10.%d.%d.%d", zi, len(version), i+1), Port: 80 + len(out),
				Zone: z, Metadata: md,
			})
		}
	}
	return out
}

func mustSubset(t testing.TB, sel string, fb SubsetFallback, def string) *Subset {
	t.Helper()
	s := &Subset{Fallback: fb}
	var err error
	if s.Selector, err = ParseSelector(sel); err != nil {
		t.Fatal(err)
	}
	if def != "" {
		if s.Default, err = ParseSelector(def); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

// picksWith chooses n times with ctx and counts picks per ID prefix
// (the version: "v1", "v2").
func picksWith(t testing.TB, b *Balancer, ctx context.Context, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for range n {
		s, err := b.Choose(ctx)
		if err != nil {
			t.Fatal(err)
		}
		version, _, _ := strings.Cut(s.ID, "-")
		counts[version]++
	}
	return counts
}

func TestParseSelector(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "version=v2", want: "version=v2"},
		{in: " version = v2 , region=eu", want: "region=eu,version=v2"},
		{in: "", err: "empty selector"},
		{in: "version", err: "want key=value"},
		{in: "version=", err: "want key=value"},
		{in: "=v2", err: "want key=value"},
		{in: "a=1,a=2", err: `key "a" twice`},
	} {
		s, err := ParseSelector(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("ParseSelector(%q) = %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || s.String() != tc.want {
			t.Errorf("ParseSelector(%q) = %q, %v; want %q", tc.in, s, err, tc.want)
		}
	}
	sel, _ := ParseSelector("version=v2,region=eu")
	if !sel.Matches(map[string]string{"version": "v2", "region": "eu", "x": "y"}) || sel.Matches(map[string]string{"version": "v2"}) {
		t.Fatal("Matches")
	}
}

func TestSubsetValidate(t *testing.T) {
	sel, _ := ParseSelector("version=v2")
	for _, tc := range []struct {
		s   Subset
		err string
	}{
		{Subset{Selector: sel}, ""},
		{Subset{Selector: sel, Fallback: FallbackNone}, ""},
		{Subset{}, "selector: empty"},
		{Subset{Selector: sel, Fallback: "nope"}, `fallback: "nope" is not one of any, default, none`},
		{Subset{Selector: sel, Fallback: FallbackDefault}, "default: fallback \"default\" needs a default subset"},
		{Subset{Selector: sel, Default: sel}, "default: set only with fallback"},
	} {
		err := tc.s.Validate()
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, want %q", tc.s, err, tc.err)
		}
	}
}

// A hint selects the instances whose metadata "hint" equals it, and every
// instance when none does (Spring Cloud LoadBalancer's X-SC-LB-Hint).
func TestHintSelectsOrFallsBackToAll(t *testing.T) {
	list := append(versioned("v1", "", 3, "a"), versioned("v2", "canary", 1, "a")...)
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, list)

	if got := picksWith(t, tb.Balancer, WithHint(t.Context(), "canary"), 100); got["v2"] != 100 {
		t.Fatalf("hint canary: %v, want every pick on v2", got)
	}
	if got := picksWith(t, tb.Balancer, WithHint(t.Context(), "nobody"), 400); got["v1"] != 300 || got["v2"] != 100 {
		t.Fatalf("unmatched hint: %v, want every instance in turn", got)
	}
	if h, ok := HintFrom(WithHint(t.Context(), "x")); !ok || h != "x" {
		t.Fatalf("HintFrom = %q, %v", h, ok)
	}
}

// A selector's fallback: any instance, the default subset, or none (an
// error matching ErrNoSubset and ErrNoServers, naming the selector).
func TestSubsetFallbackPolicies(t *testing.T) {
	list := append(versioned("v1", "", 2, "a"), versioned("v2", "", 2, "a")...)
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, list)
	ctx := t.Context()

	if got := picksWith(t, tb.Balancer, WithSubset(ctx, mustSubset(t, "version=v2", FallbackNone, "")), 50); got["v2"] != 50 {
		t.Fatalf("version=v2: %v", got)
	}
	if got := picksWith(t, tb.Balancer, WithSubset(ctx, mustSubset(t, "version=v3", "", "")), 100); got["v1"] != 50 || got["v2"] != 50 {
		t.Fatalf("version=v3, fallback any: %v", got)
	}
	if got := picksWith(t, tb.Balancer, WithSubset(ctx, mustSubset(t, "version=v3", FallbackDefault, "version=v1")), 50); got["v1"] != 50 {
		t.Fatalf("version=v3, default v1: %v", got)
	}
	for _, s := range []*Subset{
		mustSubset(t, "version=v3", FallbackNone, ""),
		mustSubset(t, "version=v3", FallbackDefault, "version=v9"),
	} {
		_, err := tb.Choose(WithSubset(ctx, s))
		var nse *NoSubsetError
		if !errors.Is(err, ErrNoSubset) || !errors.Is(err, ErrNoServers) || !errors.As(err, &nse) || !strings.Contains(err.Error(), "no instance matches version=v3") {
			t.Fatalf("%v: %v", s, err)
		}
		if _, err := tb.Pick(WithSubset(ctx, s)); !errors.Is(err, ErrNoSubset) {
			t.Fatalf("Pick: %v", err)
		}
		t.Log(err)
	}
	// A hint wins over the subset, whose own choice is the hint's fallback.
	hinted := WithHint(WithSubset(ctx, mustSubset(t, "version=v3", FallbackNone, "")), "nobody")
	if _, err := tb.Choose(hinted); !errors.Is(err, ErrNoSubset) {
		t.Fatalf("unmatched hint over a strict subset: %v", err)
	}
}

// Subsets follow the list: an instance that joins, is marked down, or
// leaves is in or out of its subset at the next pick.
func TestSubsetFollowsListChanges(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, versioned("v1", "", 2, "a"))
	strict := WithSubset(t.Context(), mustSubset(t, "version=v2", FallbackNone, ""))
	if _, err := tb.Choose(strict); !errors.Is(err, ErrNoSubset) {
		t.Fatalf("no v2 yet: %v", err)
	}
	v2 := versioned("v2", "", 2, "a")
	if err := tb.AddServers(v2...); err != nil {
		t.Fatal(err)
	}
	if got := picksWith(t, tb.Balancer, strict, 20); got["v2"] != 20 {
		t.Fatalf("v2 added: %v", got)
	}
	tb.MarkServerDown(v2[0].ID)
	for range 20 {
		if s, err := tb.Choose(strict); err != nil || s.ID != v2[1].ID {
			t.Fatalf("v2 %s down: %v %v", v2[0].ID, s, err)
		}
	}
	tb.MarkServerDown(v2[1].ID)
	if _, err := tb.Choose(strict); !errors.Is(err, ErrNoSubset) {
		t.Fatalf("every v2 down: %v", err)
	}
	tb.MarkServerUp(v2[1].ID)
	if err := tb.SetServers(append(versioned("v1", "", 2, "a"), v2[1])); err != nil {
		t.Fatal(err)
	}
	if s, err := tb.Choose(strict); err != nil || s.ID != v2[1].ID {
		t.Fatalf("v2 %s left: %v %v", v2[0].ID, s, err)
	}
}

// An instance's statistics and breaker are the same through a subset and
// through the whole list; the zone choice inside a subset sees a trip at
// once: with the client in zone a, whose one v2 instance is tripped, v2
// picks go to zone b's (the defect of issue 20, inside a subset).
func TestSubsetSharesStatsAndBreaker(t *testing.T) {
	list := append(versioned("v1", "", 2, "a", "b"), versioned("v2", "", 1, "a")...)
	list = append(list, Server{ID: "v2-b9", Host: "10.9.9.9", Port: 80, Zone: "b", Metadata: map[string]string{"version": "v2"}})
	tb := newTest(t, func(c *Config) {
		c.Rule = RuleRoundRobin
		c.Zone = "a"
		c.Filter = FilterZonePreference
	}, list)
	v2 := WithSubset(t.Context(), mustSubset(t, "version=v2", FallbackNone, ""))

	p, err := tb.Pick(v2)
	if err != nil || p.Server.ID != "v2-a0" {
		t.Fatalf("client zone a: %v %v, want v2-a0", p.Server, err)
	}
	if n := tb.ServerStats("v2-a0").ActiveRequests(); n != 1 {
		t.Fatalf("active requests of v2-a0 in the whole list: %d, want 1", n)
	}
	p.Done(DoneInfo{})

	tb.trip(t, "v2-a0")
	for range 20 {
		s, err := tb.Choose(v2)
		if err != nil || s.ID != "v2-b9" {
			t.Fatalf("v2-a0 tripped: %v %v, want v2-b9", s, err)
		}
	}
	tb.clock.Advance(tb.cfg.Breaker.Factor)
	if s, err := tb.Choose(v2); err != nil || s.ID != "v2-a0" {
		t.Fatalf("blackout over: %v %v, want v2-a0 again", s, err)
	}
}

// A pick through a subset allocates nothing: the subset is found with two
// map lookups in the index built at the list change.
func TestSubsetPickAllocatesNothing(t *testing.T) {
	list := append(versioned("v1", "", 50, "a", "b"), versioned("v2", "", 5, "a", "b")...)
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, list)
	ctx := WithHint(WithSubset(t.Context(), mustSubset(t, "version=v2", FallbackNone, "")), "none")
	if _, err := tb.Choose(ctx); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { tb.Choose(ctx) }); n != 0 {
		t.Fatalf("%v allocations per pick", n)
	}
}

// BenchmarkSubsetChoose compares a pick over N = 10,000 servers in two
// zones with a pick through a 5 % subset of them (the canary), and through
// an unmatched hint that falls back to the whole list.
func BenchmarkSubsetChoose(b *testing.B) {
	list := append(versioned("v1", "", 4750, "a", "b"), versioned("v2", "", 250, "a", "b")...)
	for _, rule := range []string{RuleRoundRobin, RuleZoneAvoidance} {
		cfg := DefaultConfig()
		cfg.Rule = rule
		tb, err := New("svc", cfg) // the system clock, as in production
		if err != nil {
			b.Fatal(err)
		}
		if err := tb.SetServers(list); err != nil {
			b.Fatal(err)
		}
		for _, bc := range []struct {
			name string
			ctx  context.Context
		}{
			{"whole", context.Background()},
			{"subset", WithSubset(context.Background(), mustSubset(b, "version=v2", FallbackNone, ""))},
			{"hint-fallback", WithHint(context.Background(), "nobody")},
		} {
			b.Run(rule+"/"+bc.name, func(b *testing.B) {
				for b.Loop() {
					if _, err := tb.Choose(bc.ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSubsetBestAvailablePick is a BestAvailable Pick and its Done
// at N = 10,000 in two zones, through the whole list and through a 5 %
// subset, without and with the subsets indexed (a v2 server's request
// then updates the trees of the v2 subset as well as the whole list's).
func BenchmarkSubsetBestAvailablePick(b *testing.B) {
	list := append(versioned("v1", "", 4750, "a", "b"), versioned("v2", "", 250, "a", "b")...)
	whole := context.Background()
	v2 := WithSubset(context.Background(), mustSubset(b, "version=v2", FallbackNone, ""))
	for _, indexed := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Rule = RuleBestAvailable
		bal, err := New("svc", cfg, WithoutPickTiming())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bal.Close() })
		if err := bal.SetServers(list); err != nil {
			b.Fatal(err)
		}
		ctxs := []struct {
			name string
			ctx  context.Context
		}{{"whole", whole}}
		if indexed {
			ctxs = append(ctxs, struct {
				name string
				ctx  context.Context
			}{"subset", v2})
		}
		for _, c := range ctxs {
			if _, err := bal.Choose(c.ctx); err != nil { // builds the subsets and the zones' trees
				b.Fatal(err)
			}
		}
		for _, c := range ctxs {
			name := "plain/" + c.name
			if indexed {
				name = "indexed/" + c.name
			}
			b.Run(name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					p, err := bal.Pick(c.ctx)
					if err != nil {
						b.Fatal(err)
					}
					p.Done(DoneInfo{ResponseTime: time.Millisecond})
				}
			})
		}
	}
}

// Beyond maxSubsetKeySets distinct key sets, a selector with new keys is
// not indexed: its pick falls back as its subset says, and the index
// stays bounded.
func TestSubsetKeySetsAreBounded(t *testing.T) {
	var list []Server
	for i := range maxSubsetKeySets + 1 {
		list = append(list, Server{ID: fmt.Sprintf("s%d", i), Host: "10.0.0.1", Port: 1000 + i,
			Metadata: map[string]string{fmt.Sprintf("k%d", i): "x"}})
	}
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, list)
	for i := range maxSubsetKeySets {
		s := mustSubset(t, fmt.Sprintf("k%d=x", i), FallbackNone, "")
		if got, err := tb.Choose(WithSubset(t.Context(), s)); err != nil || got.ID != fmt.Sprintf("s%d", i) {
			t.Fatalf("k%d: %v %v", i, got, err)
		}
	}
	over := mustSubset(t, fmt.Sprintf("k%d=x", maxSubsetKeySets), FallbackNone, "")
	if _, err := tb.Choose(WithSubset(t.Context(), over)); !errors.Is(err, ErrNoSubset) {
		t.Fatalf("key set %d: %v, want the fallback none", maxSubsetKeySets+1, err)
	}
	if n := len(tb.subsets.keySets); n != maxSubsetKeySets {
		t.Fatalf("%d key sets indexed", n)
	}
}

// Picks through subsets run concurrently with list changes (under -race):
// each sees one index, and a v2 pick always gets a v2 server.
func TestSubsetPicksDuringListChanges(t *testing.T) {
	v1, v2 := versioned("v1", "", 4, "a", "b"), versioned("v2", "", 2, "a", "b")
	tb := newTest(t, nil, append(v1, v2...))
	ctx := WithSubset(t.Context(), mustSubset(t, "version=v2", FallbackAny, ""))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := tb.Pick(ctx)
				if err != nil {
					errs <- err
					return
				}
				p.Done(DoneInfo{})
			}
		}()
	}
	for i := range 300 {
		list := append(slices.Clone(v1), v2[:1+i%len(v2)]...)
		if err := tb.SetServers(list); err != nil {
			t.Fatal(err)
		}
		tb.MarkServerDown(v1[i%len(v1)].ID)
		s, err := tb.Choose(ctx)
		if err != nil || !strings.HasPrefix(s.ID, "v2-") {
			t.Fatalf("change %d: %v %v", i, s, err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// BenchmarkSubsetListChange measures a list change of N = 10,000 servers
// (one server leaves or comes back) without subsets, and with the
// version and hint key sets indexed (the rebuild of the subset index, by
// the change's listener, included).
func BenchmarkSubsetListChange(b *testing.B) {
	full := append(versioned("v1", "", 4750, "a", "b"), versioned("v2", "canary", 250, "a", "b")...)
	short := full[1:]
	for _, indexed := range []bool{false, true} {
		name := "plain"
		if indexed {
			name = "subsets"
		}
		b.Run(name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Rule = RuleRoundRobin
			tb, err := New("svc", cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := tb.SetServers(full); err != nil {
				b.Fatal(err)
			}
			if indexed {
				for _, ctx := range []context.Context{
					WithHint(context.Background(), "canary"),
					WithSubset(context.Background(), mustSubset(b, "version=v2", "", "")),
				} {
					if _, err := tb.Choose(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if n := len(tb.subsets.index.Load().byKeys); n != 2 {
					b.Fatalf("%d key sets indexed", n)
				}
			}
			i := 0
			for b.Loop() {
				list := full
				if i%2 == 0 {
					list = short
				}
				i++
				if err := tb.SetServers(list); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BestAvailable inside a subset sees requests started and ended anywhere
// at once, with no resync (the fake clock stands still, so none is due):
// requests held on a canary instance through the whole list make the
// canary subset, the hint's subset and the whole list avoid it, and they
// all pick it again once the requests end. With a client zone, the
// subset's zone view has its tree too.
func TestSubsetBestAvailableSeesLoadAtOnce(t *testing.T) {
	for _, zone := range []string{"", "a"} {
		t.Run("zone="+zone, func(t *testing.T) {
			list := append(versioned("v1", "", 2, "a", "b"), versioned("v2", "canary", 2, "a", "b")...)
			tb := newTest(t, func(c *Config) {
				c.Rule = RuleBestAvailable
				c.Zone = zone
				if zone == "" {
					c.Filter, c.ZoneAware = FilterNone, false
				}
			}, list)
			ctxs := map[string]context.Context{
				"whole list": t.Context(),
				"subset":     WithSubset(t.Context(), mustSubset(t, "version=v2", FallbackNone, "")),
				"hint":       WithHint(t.Context(), "canary"),
			}
			// The candidates of each: the client's zone's only, with one.
			want := map[string][]string{
				"whole list": {"v1-a0", "v1-a1", "v1-b0", "v1-b1", "v2-a0", "v2-a1", "v2-b0", "v2-b1"},
				"subset":     {"v2-a0", "v2-a1", "v2-b0", "v2-b1"},
				"hint":       {"v2-a0", "v2-a1", "v2-b0", "v2-b1"},
			}
			if zone != "" {
				for name, ids := range want {
					want[name] = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !strings.Contains(id, "-a") })
				}
			}
			picked := func(name string) map[string]int {
				t.Helper()
				counts := map[string]int{}
				for range 400 {
					s, err := tb.Choose(ctxs[name])
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					counts[s.ID]++
				}
				return counts
			}
			for name := range ctxs {
				picked(name) // the subsets and their trees are built
			}

			busy := tb.Server("v2-a0")
			var held []Pick
			for range 3 {
				held = append(held, tb.Begin(busy))
			}
			for name := range ctxs {
				counts := picked(name)
				if counts["v2-a0"] != 0 {
					t.Errorf("%s: v2-a0 holds 3 requests, picked %d times: %v", name, counts["v2-a0"], counts)
				}
				checkUniform(t, counts, slices.DeleteFunc(slices.Clone(want[name]), func(id string) bool { return id == "v2-a0" }), 400, 0.3)
			}
			checkSubsetTrees(t, tb)
			for _, p := range held {
				p.Done(DoneInfo{})
			}
			for name := range ctxs {
				checkUniform(t, picked(name), want[name], 400, 0.3)
			}
			checkSubsetTrees(t, tb)
			// A pick and its end through a subset, which update every
			// tree of the server, allocate nothing.
			subset := ctxs["subset"]
			if n := testing.AllocsPerRun(200, func() {
				p, err := tb.Pick(subset)
				if err != nil {
					t.Fatal(err)
				}
				p.Done(DoneInfo{})
			}); n != 0 {
				t.Errorf("%v allocations per subset Pick and Done", n)
			}
		})
	}
}

// checkSubsetTrees verifies that every BestAvailable tree of the subsets
// indexed matches its servers' statistics, leaf by leaf.
func checkSubsetTrees(t *testing.T, tb *testBalancer) {
	t.Helper()
	idx := tb.subsets.index.Load()
	if idx == nil {
		t.Fatal("no subset index")
	}
	now := tb.shared.nanotime()
	trees := 0
	for _, byValues := range idx.byKeys {
		for _, sv := range byValues {
			views := []*View{&sv.snap.full}
			for _, g := range sv.snap.zones {
				views = append(views, &g.view)
			}
			for _, v := range views {
				tr := v.least.Load()
				if tr == nil {
					continue
				}
				trees++
				for i, s := range tr.servers {
					if got, want := tr.levels[0][i].Load(), func() uint64 { w, _ := leafWord(s.inst.view(), now, true); return w }(); got != want {
						t.Errorf("subset tree: leaf %s = %x, want %x", s.ID, got, want)
					}
				}
			}
		}
	}
	if trees == 0 {
		t.Fatal("no subset tree built")
	}
}

// Under BestAvailable, only the subsets picked from have trees: a subset
// no pick uses (version=v1 when only the canary is asked for) costs its
// servers' requests nothing, and a subset picked from before a list
// change has its tree built with the new index, not by its first pick.
func TestSubsetTreesOnlyForSubsetsPicked(t *testing.T) {
	list := append(versioned("v1", "", 3, "a"), versioned("v2", "", 2, "a")...)
	tb := newTest(t, func(c *Config) {
		c.Rule = RuleBestAvailable
		c.Filter, c.ZoneAware = FilterNone, false
	}, list)
	v2 := WithSubset(t.Context(), mustSubset(t, "version=v2", FallbackNone, ""))
	if _, err := tb.Choose(v2); err != nil {
		t.Fatal(err)
	}
	tree := func(version string) *activeTree {
		t.Helper()
		v := tb.subsets.index.Load().byKeys["version"][version]
		if v == nil {
			t.Fatalf("no subset %s", version)
		}
		return v.snap.full.least.Load()
	}
	if tree("v1") != nil || tree("v2") == nil {
		t.Fatalf("trees: v1 %p, v2 %p: want v2's only", tree("v1"), tree("v2"))
	}
	if n := len(tb.Server("v1-a0").inst.view().watch.Load().leaves); n != 1 {
		t.Fatalf("a v1 server is watched by %d trees, want the whole list's", n)
	}
	if n := len(tb.Server("v2-a0").inst.view().watch.Load().leaves); n != 2 {
		t.Fatalf("a v2 server is watched by %d trees, want the whole list's and v2's", n)
	}
	if err := tb.SetServers(list[1:]); err != nil { // the listener rebuilds the index
		t.Fatal(err)
	}
	if tb.subsets.index.Load().parent != tb.Snapshot() || tree("v1") != nil || tree("v2") == nil {
		t.Fatal("after a list change: want the new index, with v2's tree built and v1's not")
	}
}
