package balancer

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func TestPickDone(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, servers(1, "", 0))
	st := tb.ServerStats("s0")

	p, err := tb.Pick(t.Context())
	if err != nil || p.Server.ID != "s0" {
		t.Fatalf("Pick = %v, %v", p.Server, err)
	}
	if st.ActiveRequests() != 1 || st.Requests() != 1 {
		t.Fatalf("after Pick: active %d, requests %d; want 1, 1", st.ActiveRequests(), st.Requests())
	}
	tb.clock.Advance(7 * time.Millisecond)
	p.Done(DoneInfo{}) // response time measured on the balancer's clock
	if rt, ok := st.ResponseTime(); !ok || rt != 7*time.Millisecond || st.ActiveRequests() != 0 {
		t.Fatalf("after Done: response time %v %v, active %d; want 7ms, 0", rt, ok, st.ActiveRequests())
	}

	// Connection failures feed the breaker; other failures only end.
	for range 3 {
		p, _ := tb.Pick(t.Context())
		p.Done(DoneInfo{Err: errors.New("refused"), ConnectFailure: true})
	}
	if !st.CircuitTripped() || st.ActiveRequests() != 0 {
		t.Fatalf("3 connection failures: tripped %v, active %d", st.CircuitTripped(), st.ActiveRequests())
	}
	p = tb.Begin(p.Server)
	p.Done(DoneInfo{Err: errors.New("reset")})
	if st.SuccessiveFailures() != 3 || st.ActiveRequests() != 0 {
		t.Fatalf("a read failure counted: failures %d, active %d", st.SuccessiveFailures(), st.ActiveRequests())
	}

	// Choose records nothing.
	if _, err := tb.Choose(t.Context()); err != nil || st.Requests() != 5 || st.ActiveRequests() != 0 {
		t.Fatalf("Choose recorded a request: %d requests, %d active", st.Requests(), st.ActiveRequests())
	}
}

// Responded then End: the response time and the breaker reset at the
// answer's start, the request active until its end (a streamed body).
func TestPickRespondedThenEnd(t *testing.T) {
	tb := newTest(t, nil, servers(1, "", 0))
	st := tb.ServerStats("s0")
	for range 3 {
		tb.Begin(tb.Server("s0")).Done(DoneInfo{ConnectFailure: true})
	}
	p := tb.Begin(tb.Server("s0"))
	p.Responded(3 * time.Millisecond)
	if rt, _ := st.ResponseTime(); rt != 3*time.Millisecond || st.SuccessiveFailures() != 0 || st.CircuitTripped() {
		t.Fatalf("after Responded: response time %v, failures %d", rt, st.SuccessiveFailures())
	}
	if st.ActiveRequests() != 1 {
		t.Fatalf("after Responded: active %d, want 1 until End", st.ActiveRequests())
	}
	p.End()
	if st.ActiveRequests() != 0 {
		t.Fatalf("after End: active %d", st.ActiveRequests())
	}

	// End alone drops a pick that was never sent.
	p = tb.Begin(tb.Server("s0"))
	p.End()
	if st.ActiveRequests() != 0 || st.Requests() != 5 {
		t.Fatalf("End alone: active %d, requests %d", st.ActiveRequests(), st.Requests())
	}
	if n := responsesOf(st); n != 1 {
		t.Fatalf("End alone recorded a response: %d responses", n)
	}

	// A zero Pick, or one of a server not from a balancer, records nothing.
	var zero Pick
	zero.Done(DoneInfo{})
	zero.Responded(0)
	zero.End()
	tb.Begin(&Server{Host: "h", Port: 1}).Done(DoneInfo{})
}

func responsesOf(st *ServerStats) int64 { return st.responses.Load() }

// The zone-aware choice is made once per pick, by the balancer, for
// Config.ZoneAware or for a rule that asks for it (ZoneAvoidance).
func TestZoneChoice(t *testing.T) {
	for _, tc := range []struct {
		rule      string
		zoneAware bool
		avoids    bool
	}{
		{RuleRoundRobin, true, true},
		{RuleRoundRobin, false, false},
		{RuleZoneAvoidance, true, true},
		{RuleZoneAvoidance, false, true},
		{RuleRandom, true, true},
		{RuleRetry, false, false}, // over RoundRobin
	} {
		name := tc.rule
		if tc.zoneAware {
			name += "/zoneAware"
		}
		t.Run(name, func(t *testing.T) {
			// Zone a is overloaded: 2 active requests per server.
			tb := newTest(t, func(c *Config) { c.Rule = tc.rule; c.ZoneAware = tc.zoneAware }, zoned(2, "a", "b", "c"))
			for _, id := range []string{"a0", "a0", "a1", "a1"} {
				tb.Begin(tb.Server(id))
			}
			// Load reaches the zone choice within ZoneStatsInterval.
			tb.clock.Advance(tb.cfg.ZoneStatsInterval)
			counts := tb.pickCounts(t, 600)
			inA := counts["a0"] + counts["a1"]
			if tc.avoids && inA != 0 {
				t.Fatalf("overloaded zone a picked %d times: %v", inA, counts)
			}
			if !tc.avoids && inA < 100 {
				t.Fatalf("zone a picked %d times of 600 without zone avoidance: %v", inA, counts)
			}
		})
	}
}

// ZoneAvoidance checks the availability predicate in the drawn zone, then
// over every candidate, then takes any server of the zone.
func TestZoneAvoidanceFallsBackToCandidates(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.ActiveConnectionsLimit = 1 }, zoned(1, "a", "b"))
	tb.Begin(tb.Server("a0")) // a0 at its limit
	rule := tb.rule.(*ZoneAvoidance)
	snap := tb.Snapshot()
	p := PickInfo{Ctx: t.Context(), View: snap.Zone("a"), Candidates: snap.Full(), b: tb.Balancer}
	if s, _ := rule.Choose(p); s == nil || s.ID != "b0" {
		t.Fatalf("a0 at its limit: got %v, want b0 from the candidates", s)
	}
	tb.Begin(tb.Server("b0"))
	if s, _ := rule.Choose(p); s == nil || s.ID != "a0" {
		t.Fatalf("every server at its limit: got %v, want a0 of the drawn zone", s)
	}
}

// PickInfo.Now reads the clock at most once per pick.
func TestPickInfoNow(t *testing.T) {
	tb := newTest(t, nil, servers(1, "", 0))
	p := tb.pickInfo(t.Context(), tb.Snapshot())
	first := p.Now()
	tb.clock.Advance(time.Second)
	if p.Now() != first {
		t.Fatal("Now changed within one pick")
	}
	if q := p.Refresh(); q.Now() != first+time.Second {
		t.Fatalf("a refreshed PickInfo reads the clock again: %v, want %v", q.Now(), first+time.Second)
	}
	if k, ok := (&PickInfo{Ctx: WithKey(context.Background(), "u")}).Key(); !ok || k != "u" {
		t.Fatalf("Key = %q, %v", k, ok)
	}
}

// The pick path of the simple rules allocates nothing: Choose, Pick and
// the Pick's report.
func TestPickDoesNotAllocate(t *testing.T) {
	for _, rule := range []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance, RuleAvailabilityFiltering} {
		tb := newTest(t, func(c *Config) { c.Rule = rule }, zoned(3, "a", "b", "c"))
		ctx := t.Context()
		if n := testing.AllocsPerRun(200, func() {
			if _, err := tb.Choose(ctx); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("%s: Choose allocates %v times", rule, n)
		}
		if n := testing.AllocsPerRun(200, func() {
			p, err := tb.Pick(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.Responded(time.Millisecond)
			p.End()
			p, _ = tb.Pick(ctx)
			p.Done(DoneInfo{})
		}); n != 0 {
			t.Errorf("%s: Pick and its report allocate %v times", rule, n)
		}
	}
}

func TestRuleNamesInErrors(t *testing.T) {
	if _, err := NewRule("nope", &Config{}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "RoundRobin") {
		t.Fatalf("NewRule(nope) = %v", err)
	}
}

// TestBreakerCountersLazy: a server's breaker counters are allocated on its
// first connection failure, once however many goroutines fail it at once,
// and read as 0 (closed, nothing remaining) until then: answers, server
// errors and read failures allocate none. The breaker then works as
// before: it opens at the threshold, the blackout runs, an answer resets it.
func TestBreakerCountersLazy(t *testing.T) {
	tb := newTest(t, nil, servers(3, "a", 0))
	for _, s := range tb.AllServers() {
		tb.Begin(s).Done(DoneInfo{ResponseTime: time.Millisecond})
		tb.Begin(s).Done(DoneInfo{ResponseTime: time.Millisecond, ServerError: true})
		tb.Begin(s).Done(DoneInfo{Err: errors.New("reset")})
		st := s.Stats()
		if st.breaker.Load() != nil || st.SuccessiveFailures() != 0 || st.CircuitTripped() || st.BlackoutRemaining() != 0 {
			t.Fatalf("%s: counters %v after no connection failure, failures %d", s.ID, st.breaker.Load(), st.SuccessiveFailures())
		}
	}
	s1 := tb.Server("s1")
	st := s1.Stats()
	var wg sync.WaitGroup
	for range 3 { // three failures from three goroutines: one set of counters
		wg.Go(func() { tb.Begin(s1).Done(DoneInfo{ConnectFailure: true}) })
	}
	wg.Wait()
	if st.SuccessiveFailures() != 3 || !st.CircuitTripped() || st.BlackoutRemaining() != 10*time.Second {
		t.Fatalf("after 3 connection failures: %d, tripped %v for %v; want 3, tripped for 10s", st.SuccessiveFailures(), st.CircuitTripped(), st.BlackoutRemaining())
	}
	if n := tb.pickCounts(t, 60)["s1"]; n != 0 {
		t.Fatalf("tripped s1 picked %d times", n)
	}
	if tb.ServerStats("s2").breaker.Load() != nil {
		t.Fatal("s2: counters allocated by another server's failures")
	}
	tb.clock.Advance(10 * time.Second)
	if st.CircuitTripped() {
		t.Fatal("still tripped after the blackout")
	}
	tb.Begin(s1).Done(DoneInfo{ResponseTime: time.Millisecond})
	if st.SuccessiveFailures() != 0 || st.BlackoutRemaining() != 0 {
		t.Fatalf("after an answer: failures %d, blackout %v", st.SuccessiveFailures(), st.BlackoutRemaining())
	}
	if size := unsafe.Sizeof(ServerStats{}); size > 80 {
		t.Errorf("ServerStats is %d bytes, want at most 80 (an 80-byte allocation)", size)
	}
	if size := unsafe.Sizeof(instance{}); size > 16 {
		t.Errorf("instance is %d bytes, want at most 16 (a 16-byte allocation)", size)
	}
}

// TestStatisticsFromTheFirstRequest: a server's statistics are allocated
// at its first request; choosing, reading the zone snapshots and asking
// whether a breaker is open allocate none, and what a server records
// never reaches the others' (the balancer's zero statistics stay zero).
func TestStatisticsFromTheFirstRequest(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleZoneAvoidance }, servers(4, "z1", 0))
	ctx := context.Background()
	owned := func() (n int) {
		for _, s := range tb.AllServers() {
			if s.inst.hasOwn() {
				n++
			}
		}
		return n
	}
	for range 20 {
		if _, err := tb.Choose(ctx); err != nil {
			t.Fatal(err)
		}
	}
	tb.ZoneSnapshots()
	for _, s := range tb.AllServers() {
		if s.PeekStats().CircuitTripped() {
			t.Fatalf("%s tripped", s.ID)
		}
	}
	if n := owned(); n != 0 {
		t.Fatalf("%d servers hold statistics before any request", n)
	}
	p, err := tb.Pick(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := owned(); n != 1 {
		t.Fatalf("%d servers hold statistics after one pick, want 1", n)
	}
	for range 5 {
		tb.Begin(p.Server).Done(DoneInfo{Err: errors.New("refused"), ConnectFailure: true})
	}
	p.Done(DoneInfo{ResponseTime: time.Millisecond})
	if st := p.Server.Stats(); st.Requests() != 6 {
		t.Fatalf("picked server: %d requests recorded, want 6", st.Requests())
	}
	none := &tb.shared.none
	if none.Requests() != 0 || none.active.Load() != 0 || none.failureCount() != 0 || none.breaker.Load() != nil || none.outlier.Load() != nil || none.watch.Load() != nil {
		t.Fatal("the zero statistics were written")
	}
	other := tb.AllServers()[0]
	if other == p.Server {
		other = tb.AllServers()[1]
	}
	if other.inst.hasOwn() {
		t.Fatal("another server's statistics allocated")
	}
	if st := other.Stats(); st == nil || st.Requests() != 0 || other.inst.stats.Load() != st {
		t.Fatal("Stats did not allocate the live statistics of a server without requests")
	}
}

// TestServerSize bounds a balancer's copy of a server, one per instance
// (100,000 in a large fleet): a field added to it is a decision
// (docs/perf/memory.md).
func TestServerSize(t *testing.T) {
	if size := unsafe.Sizeof(Server{}); size > 144 {
		t.Fatalf("Server is %d bytes, want at most 144 (a 144-byte allocation)", size)
	}
}

func TestAddrAsJoinHostPort(t *testing.T) {
	for _, s := range []Server{{Host: "10.0.0.1", Port: 80}, {Host: "::1", Port: 65535}, {Host: "fe80::1%eth0", Port: 1}, {Host: "svc.example", Port: 8080}} {
		if got, want := s.Addr(), net.JoinHostPort(s.Host, strconv.Itoa(s.Port)); got != want {
			t.Errorf("Addr() = %q, want %q", got, want)
		}
	}
}
