package balancer

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func ids(list []*Server) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = s.ID
	}
	return out
}

func TestSetServersValidatesAndKeepsGoodList(t *testing.T) {
	tb := newTest(t, nil, servers(2, "", 0))
	err := tb.SetServers([]Server{{Host: "", Port: 1}, {Host: "h", Port: 0}, {Host: "h", Port: 1, Scheme: "ftp"}})
	if err == nil || !strings.Contains(err.Error(), "list kept") {
		t.Fatalf("an all-invalid list must be refused, got %v", err)
	}
	if got := ids(tb.AllServers()); !slices.Equal(got, []string{"s0", "s1"}) {
		t.Fatalf("the healthy list was replaced: %v", got)
	}

	err = tb.SetServers([]Server{{Host: "10.0.0.1", Port: 80}, {Host: "bad", Port: 70000}, {ID: "10.0.0.1:80", Host: "10.0.0.9", Port: 1}})
	if err == nil {
		t.Fatal("want an error naming the invalid and duplicate entries")
	}
	if got := ids(tb.AllServers()); !slices.Equal(got, []string{"10.0.0.1:80"}) {
		t.Fatalf("valid entries should apply, default ID host:port, first duplicate wins: %v", got)
	}

	if err := tb.SetServers(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Choose(t.Context()); !errors.Is(err, ErrNoServers) {
		t.Fatalf("an empty list is a real state: want ErrNoServers, got %v", err)
	}
}

func TestStatsSurviveListChanges(t *testing.T) {
	tb := newTest(t, nil, servers(3, "", 0))
	st := tb.ServerStats("s1")
	st.requestStarted()
	for range 3 {
		st.noteConnectionFailure()
	}
	// s1 stays (with a new port, even), s0 leaves, s3 arrives.
	next := []Server{{ID: "s1", Host: "10.0.0.2", Port: 9999}, {ID: "s2", Host: "10.0.0.3", Port: 8080}, {ID: "s3", Host: "10.0.0.4", Port: 8080}}
	if err := tb.SetServers(next); err != nil {
		t.Fatal(err)
	}
	if got := tb.ServerStats("s1"); got != st || got.ActiveRequests() != 1 || !got.CircuitTripped() {
		t.Fatal("stats of a server that stayed were lost")
	}
	if tb.ServerStats("s0") != nil {
		t.Fatal("stats of a server that left are still listed")
	}
	if tb.ServerStats("s3").Requests() != 0 {
		t.Fatal("a new server should start with fresh stats")
	}
}

func TestListenersGetOldAndNew(t *testing.T) {
	tb := newTest(t, nil, servers(2, "", 0))
	type call struct{ old, new []string }
	var mu sync.Mutex
	var calls []call
	tb.AddListener(func(old, new []*Server) {
		mu.Lock()
		calls = append(calls, call{ids(old), ids(new)})
		mu.Unlock()
	})
	tb.SetServers(servers(2, "", 0)) // equal: no call
	tb.SetServers(servers(3, "", 0))
	tb.AddServers(Server{ID: "x", Host: "10.9.9.9", Port: 1})
	want := []call{
		{nil, []string{"s0", "s1"}},
		{[]string{"s0", "s1"}, []string{"s0", "s1", "s2"}},
		{[]string{"s0", "s1", "s2"}, []string{"s0", "s1", "s2", "x"}},
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != len(want) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	for i := range want {
		if !slices.Equal(calls[i].old, want[i].old) || !slices.Equal(calls[i].new, want[i].new) {
			t.Fatalf("call %d = %v, want %v", i, calls[i], want[i])
		}
	}
}

// TestRemovedServerIsReleased: once its listeners were told, a change
// holds nothing: the servers a change removed are garbage, not kept by
// the balancer's queue of changes until the next one.
func TestRemovedServerIsReleased(t *testing.T) {
	tb := newTest(t, nil, servers(3, "", 0))
	var told atomic.Int64
	tb.AddListener(func(old, new []*Server) { told.Add(1) })
	removed := tb.Snapshot().All()[2]
	released := make(chan struct{})
	runtime.AddCleanup(removed, func(ch chan struct{}) { close(ch) }, released)
	removed = nil
	if err := tb.SetServers(servers(2, "", 0)); err != nil {
		t.Fatal(err)
	}
	if told.Load() != 2 { // the listing at AddListener, the change
		t.Fatalf("listeners told %d times, want 2", told.Load())
	}
	deadline := time.After(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-released:
			return
		case <-deadline:
			t.Fatal("the removed server is still reachable after its change was told")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestListenerMayCallBack(t *testing.T) {
	tb := newTest(t, nil, nil)
	var n atomic.Int32
	tb.AddListener(func(old, new []*Server) {
		// A listener that changes the list must not deadlock; its change
		// is delivered after this call returns.
		if len(new) == 1 {
			tb.AddServers(Server{ID: "b", Host: "10.0.0.2", Port: 1})
		}
		n.Add(1)
	})
	tb.SetServers([]Server{{ID: "a", Host: "10.0.0.1", Port: 1}})
	if got := ids(tb.AllServers()); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("list %v", got)
	}
	if n.Load() != 3 {
		t.Fatalf("listener called %d times, want 3 (initial, a, a+b)", n.Load())
	}
}

func TestAddServersReplacesSameID(t *testing.T) {
	tb := newTest(t, nil, servers(2, "", 0))
	tb.AddServers(Server{ID: "s0", Host: "10.1.1.1", Port: 81}, Server{ID: "s9", Host: "10.1.1.9", Port: 81})
	all := tb.AllServers()
	if got := ids(all); !slices.Equal(got, []string{"s0", "s1", "s9"}) {
		t.Fatalf("got %v", got)
	}
	if all[0].Host != "10.1.1.1" {
		t.Fatalf("s0 not replaced in place: %v", all[0])
	}
}

func TestMarkServerDown(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, servers(3, "", 0))
	if !tb.MarkServerDown("s1") {
		t.Fatal("s1 is listed")
	}
	if tb.MarkServerDown("nope") {
		t.Fatal("unknown ID reported as listed")
	}
	if got := ids(tb.ReachableServers()); !slices.Equal(got, []string{"s0", "s2"}) {
		t.Fatalf("reachable %v", got)
	}
	if len(tb.AllServers()) != 3 || tb.AllServers()[1].Alive() {
		t.Fatal("all servers should still list s1, not alive")
	}
	if c := tb.pickCounts(t, 100); c["s1"] != 0 {
		t.Fatalf("picked a server marked down: %v", c)
	}
	tb.SetServers(servers(3, "", 0)) // an equal list keeps it down
	if len(tb.ReachableServers()) != 2 {
		t.Fatal("an equal list update revived a server marked down")
	}
	tb.MarkServerUp("s1")
	if len(tb.ReachableServers()) != 3 {
		t.Fatal("MarkServerUp did not revive s1")
	}
	// Several at once, in one snapshot.
	before := tb.Snapshot()
	if !tb.MarkServers(map[string]bool{"s0": false, "s2": false, "nope": true}) {
		t.Fatal("s0 and s2 are listed")
	}
	if got := ids(tb.ReachableServers()); !slices.Equal(got, []string{"s1"}) || tb.Snapshot() == before {
		t.Fatalf("reachable after MarkServers %v", got)
	}
	mid := tb.Snapshot()
	if tb.MarkServers(map[string]bool{"s0": false}); tb.Snapshot() != mid {
		t.Fatal("a mark that changes nothing made a new snapshot")
	}
}

func TestConfigErrors(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"rule":       func(c *Config) { c.Rule = "Fastest" },
		"filter":     func(c *Config) { c.Filter = "Nearest" },
		"threshold":  func(c *Config) { c.Breaker.Threshold = 0 },
		"servers":    func(c *Config) { c.ListOfServers = []string{"nohostport"} },
		"ping":       func(c *Config) { c.Ping.Kind = "icmp" },
		"retry self": func(c *Config) { c.Rule = RuleRetry; c.RetrySubRule = RuleRetry },
		"blackout":   func(c *Config) { c.ZoneAvoidance.BlackoutPercentage = 2 },
	} {
		cfg := DefaultConfig()
		mut(&cfg)
		if _, err := New("svc", cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: want ErrInvalidConfig, got %v", name, err)
		}
	}
	for _, name := range []string{"roundrobin", "RoundRobinRule", "com.netflix.loadbalancer.RoundRobinRule", " zoneavoidance "} {
		if _, err := canonicalRule(name); err != nil {
			t.Errorf("rule %q: %v", name, err)
		}
	}
}

func TestParseServer(t *testing.T) {
	for in, want := range map[string]Server{
		"10.0.0.1:80":           {ID: "10.0.0.1:80", Host: "10.0.0.1", Port: 80},
		"https://api.local:443": {ID: "api.local:443", Host: "api.local", Port: 443, Scheme: "https"},
		" [::1]:8080/ ":         {ID: "[::1]:8080", Host: "::1", Port: 8080},
	} {
		got, err := ParseServer(in)
		if err != nil || !got.sameAs(&want) {
			t.Errorf("ParseServer(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "host", "host:port", "host:0", "ftp://h:1"} {
		if _, err := ParseServer(bad); err == nil {
			t.Errorf("ParseServer(%q) should fail", bad)
		}
	}
}

// TestConcurrentChooseAndChanges runs picks, list changes, mark-downs and
// stats updates together; run with -race.
func TestConcurrentChooseAndChanges(t *testing.T) {
	for _, rule := range ruleNames {
		t.Run(rule, func(t *testing.T) {
			tb := newTest(t, func(c *Config) { c.Rule = rule; c.Zone = "a"; c.RetryTimeout = 5 * time.Millisecond }, zoned(4, "a", "b", "c"))
			var stop atomic.Bool
			var wg sync.WaitGroup
			var picks atomic.Int64
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := t.Context()
					if w == 1 {
						ctx = WithZone(ctx, "b")
					}
					if w == 2 {
						ctx = WithKey(ctx, fmt.Sprint("k", w))
					}
					for !stop.Load() {
						s, err := tb.Choose(ctx)
						if err != nil {
							if errors.Is(err, ErrNoServers) {
								continue
							}
							t.Error(err)
							return
						}
						st := s.Stats()
						st.requestStarted()
						if picks.Add(1)%7 == 0 {
							st.requestFailed(true)
						} else {
							st.requestFinished(time.Millisecond)
						}
					}
				}()
			}
			for i := range 200 {
				switch i % 4 {
				case 0:
					tb.SetServers(zoned(1+i%5, "a", "b", "c"))
				case 1:
					tb.MarkServerDown("a0")
				case 2:
					tb.AddServers(zoned(2, "d")...)
				case 3:
					tb.clock.Advance(time.Second)
				}
			}
			testutil.Eventually(t, "picks to succeed", func() bool { return picks.Load() >= 100 })
			stop.Store(true)
			wg.Wait()
		})
	}
}

func TestCloseIsIdempotentAndKeepsAnswering(t *testing.T) {
	tb := newTest(t, nil, servers(2, "", 0))
	if err := tb.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	tb.Close()
	tb.Close()
	if err := tb.SetServers(servers(1, "", 0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetServers after Close: %v", err)
	}
	if _, err := tb.Choose(t.Context()); err != nil {
		t.Fatalf("Choose after Close should answer from the last list: %v", err)
	}
}

// TestTrippedFastPathFollowsTheBreakers: a pick skips reading each
// server's statistics only while no server of the balancer has reached the
// breaker's threshold; the count behind it rises with a trip and falls with
// the response that resets it, so a tripped server is never picked and a
// reset one is picked again.
func TestTrippedFastPathFollowsTheBreakers(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleZoneAvoidance }, servers(3, "", 0))
	if n := tb.shared.atThreshold.Load(); n != 0 {
		t.Fatalf("at threshold %d before any failure", n)
	}
	tb.trip(t, "s1")
	if n := tb.shared.atThreshold.Load(); n != 1 {
		t.Fatalf("at threshold %d after one trip, want 1", n)
	}
	// Failures beyond the threshold count the server once.
	tb.ServerStats("s1").noteConnectionFailure()
	if n := tb.shared.atThreshold.Load(); n != 1 {
		t.Fatalf("at threshold %d after a failure beyond the threshold, want 1", n)
	}
	if c := tb.pickCounts(t, 300); c["s1"] != 0 || c["s0"] == 0 || c["s2"] == 0 {
		t.Fatalf("picks with s1 tripped: %v", c)
	}
	tb.ServerStats("s1").requestFinished(time.Millisecond)
	if n := tb.shared.atThreshold.Load(); n != 0 {
		t.Fatalf("at threshold %d after the reset, want 0", n)
	}
	if c := tb.pickCounts(t, 300); c["s1"] == 0 {
		t.Fatalf("picks after s1's reset: %v", c)
	}
}

// TestServerValue: a server's Value rides on the balancer's copy, a new
// Value makes a new copy that keeps the instance's statistics, an equal
// list keeps the copy, and a Value that cannot be compared is refused.
func TestServerValue(t *testing.T) {
	tb := newTest(t, nil, nil)
	first, second := new(int), new(int)
	if err := tb.SetServers([]Server{{ID: "a", Host: "10.0.0.1", Port: 80, Value: first}}); err != nil {
		t.Fatal(err)
	}
	s := tb.AllServers()[0]
	if s.Value != first {
		t.Fatalf("Value %v, want the caller's %p", s.Value, first)
	}
	s.Stats().requestStarted()
	if err := tb.SetServers([]Server{{ID: "a", Host: "10.0.0.1", Port: 80, Value: first}}); err != nil {
		t.Fatal(err)
	}
	if tb.AllServers()[0] != s {
		t.Fatal("an equal server was copied again")
	}
	if err := tb.SetServers([]Server{{ID: "a", Host: "10.0.0.1", Port: 80, Value: second}}); err != nil {
		t.Fatal(err)
	}
	n := tb.AllServers()[0]
	if n == s || n.Value != second || n.Stats() != s.Stats() {
		t.Fatalf("a new Value: copy %v (old %v), Value %v, same stats %v", n, s, n.Value, n.Stats() == s.Stats())
	}
	err := tb.SetServers([]Server{{ID: "b", Host: "10.0.0.2", Port: 80, Value: []int{1}}})
	if err == nil || !strings.Contains(err.Error(), "not comparable") {
		t.Fatalf("a slice Value: %v, want refused as not comparable", err)
	}
	if got := ids(tb.AllServers()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("the list after a refused one: %v", got)
	}
}

// TestMetadataCopiesShared: servers with equal metadata share one copy,
// which is not the caller's map: changing the caller's maps afterwards
// changes nothing in the balancer.
func TestMetadataCopiesShared(t *testing.T) {
	tb := newTest(t, nil, nil)
	list := make([]Server, 10)
	for i := range list {
		meta := map[string]string{"version": "v1"}
		if i == 9 {
			meta["version"] = "v2"
		}
		list[i] = Server{ID: fmt.Sprint(i), Host: "10.0.0.1", Port: 1000 + i, Metadata: meta}
	}
	if err := tb.SetServers(list); err != nil {
		t.Fatal(err)
	}
	all := tb.AllServers()
	for i := 1; i < 9; i++ {
		if reflect.ValueOf(all[i].Metadata).UnsafePointer() != reflect.ValueOf(all[0].Metadata).UnsafePointer() {
			t.Fatalf("server %d has a copy of its own of equal metadata", i)
		}
	}
	list[0].Metadata["version"] = "changed"
	if all[0].Metadata["version"] != "v1" || all[9].Metadata["version"] != "v2" {
		t.Fatalf("the balancer's metadata: %v, %v", all[0].Metadata, all[9].Metadata)
	}
}
