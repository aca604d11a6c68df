package balancer

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowWindow is the window of the slow-start tests: refreshes every 3 s.
const slowWindow = time.Minute

// withSlowStart is a Config mutation: rule, and slow start over slowWindow
// with the defaults.
func withSlowStart(rule string) func(*Config) {
	return func(c *Config) {
		c.Rule = rule
		c.SlowStart.Window = slowWindow
	}
}

func TestSlowStartFactorIsEnvoysCurve(t *testing.T) {
	cfg := DefaultConfig().SlowStart
	cfg.Window = slowWindow
	cases := []struct {
		min, aggression float64
		at              time.Duration
		want            float64
	}{
		{10, 1, 0, 0.1},                      // max(1 s, 0) / 60 s = 0.017, below the floor
		{10, 1, 3 * time.Second, 0.1},        // 0.05, below the floor
		{10, 1, 9 * time.Second, 0.15},       // linear
		{10, 1, 30 * time.Second, 0.5},       //
		{10, 1, 59 * time.Second, 59.0 / 60}, //
		{10, 1, slowWindow, 1},               // the window is over
		{10, 2, 15 * time.Second, 0.5},       // sqrt(0.25): faster at first
		{10, 0.5, 30 * time.Second, 0.25},    // 0.5^2: slower at first
		{0, 1, 0, 1.0 / 60},                  // no floor: Envoy's max(t, 1 s)
		{100, 1, 10 * time.Second, 1},        // a floor of 100 %: no ramp
		{10, 1, 2 * slowWindow, 1},           //
		{10, 1, -time.Second, 0.1},           // a clock going back reads as 1 s: the floor
	}
	for _, c := range cases {
		cfg.MinWeightPercent, cfg.Aggression = c.min, c.aggression
		if got := cfg.Factor(c.at); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("min %v%%, aggression %v, at %v: factor %v, want %v", c.min, c.aggression, c.at, got, c.want)
		}
	}
	if got := (SlowStartConfig{}).Factor(0); got != 1 {
		t.Errorf("off: factor %v, want 1", got)
	}
}

func TestSlowStartConfigValidation(t *testing.T) {
	cases := []struct {
		set   func(*SlowStartConfig)
		field string
	}{
		{func(c *SlowStartConfig) { c.Window = -time.Second }, "slowStart.window"},
		{func(c *SlowStartConfig) { c.Window = 500 * time.Millisecond }, "slowStart.window"},
		{func(c *SlowStartConfig) { c.Window, c.MinWeightPercent = time.Minute, -1 }, "slowStart.minWeightPercent"},
		{func(c *SlowStartConfig) { c.Window, c.MinWeightPercent = time.Minute, 101 }, "slowStart.minWeightPercent"},
		{func(c *SlowStartConfig) { c.Window, c.MinWeightPercent = time.Minute, math.NaN() }, "slowStart.minWeightPercent"},
		{func(c *SlowStartConfig) { c.Window, c.Aggression = time.Minute, 0 }, "slowStart.aggression"},
		{func(c *SlowStartConfig) { c.Window, c.Aggression = time.Minute, -1 }, "slowStart.aggression"},
		{func(c *SlowStartConfig) { c.Window, c.Aggression = time.Minute, math.Inf(1) }, "slowStart.aggression"},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.set(&cfg.SlowStart)
		err := cfg.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: error %v, want one naming %s", cfg.SlowStart, err, c.field)
		}
		if _, err := New("svc", cfg); err == nil {
			t.Errorf("%+v: New accepted it", cfg.SlowStart)
		}
	}
	ok := DefaultConfig()
	if ok.SlowStart != (SlowStartConfig{MinWeightPercent: 10, Aggression: 1}) {
		t.Errorf("defaults %+v", ok.SlowStart)
	}
	ok.SlowStart = SlowStartConfig{} // off: the other settings do not matter
	if err := ok.Validate(); err != nil {
		t.Errorf("zero SlowStartConfig: %v", err)
	}
	ok.SlowStart = SlowStartConfig{Window: time.Second, MinWeightPercent: 0, Aggression: 0.1}
	if err := ok.Validate(); err != nil {
		t.Errorf("%+v: %v", ok.SlowStart, err)
	}
}

// share returns the share of n picks that went to id.
func (tb *testBalancer) share(t testing.TB, n int, id string) float64 {
	t.Helper()
	return float64(tb.pickCounts(t, n)[id]) / float64(n)
}

// newcomerShare is the share of traffic of one server ramping at factor f
// among others equal servers of full weight.
func newcomerShare(f float64, others int) float64 { return f / (float64(others) + f) }

// settleRamp makes the live weights those of the fake clock's time: while
// they are due, a pick wakes the refresher (it does not refresh them
// itself), and settleRamp waits for the snapshot it replaces, a signal,
// bounded by a timeout. It returns how many refreshes it waited for (a
// refresher that starts late may have made one already).
func (tb *testBalancer) settleRamp(t testing.TB) int {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	refreshes := 0
	for {
		snap := tb.Snapshot()
		if snap.ramp == nil || tb.shared.nanotime() < snap.ramp.due {
			return refreshes
		}
		if _, err := tb.Choose(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-snap.replaced:
			refreshes++
		case <-timeout.C:
			t.Fatalf("the live weights due at %d were not refreshed (now %d)", snap.ramp.due, tb.shared.nanotime())
		}
	}
}

// TestSlowStartTrafficFollowsTheCurve: four servers are listed (the cold
// start: no ramp), a fifth joins; its share of traffic at 0 %, 50 % and
// 100 % of the window matches Envoy's curve within 2 points, with every
// rule that weighs servers (RoundRobin exactly).
func TestSlowStartTrafficFollowsTheCurve(t *testing.T) {
	for _, rule := range []string{RuleRoundRobin, RuleRandom, RuleWeightedResponseTime, RuleLeastRequest,
		RuleAvailabilityFiltering, RuleZoneAvoidance, RuleRetry} {
		t.Run(rule, func(t *testing.T) {
			tb := newTest(t, withSlowStart(rule), zoned(2, "a", "b"))
			if r := tb.Ramping(); len(r) != 0 {
				t.Fatalf("the first list ramps: %v", r)
			}
			newcomer := Server{ID: "new", Host: "10.9.0.1", Port: 80, Zone: "b"}
			if err := tb.AddServers(newcomer); err != nil {
				t.Fatal(err)
			}
			if rule == RuleWeightedResponseTime {
				// Equal response times: Ribbon's weights are all equal, and
				// the ramp scales the newcomer's.
				for _, s := range tb.AllServers() {
					s.Stats().requestStarted()
					s.Stats().requestFinished(10 * time.Millisecond)
				}
			}
			picks := 40_000
			if rule == RuleRoundRobin {
				picks = 41 * 9 * 100 // whole cycles at 0 % (41 points) and at 50 % (9)
			}
			for _, at := range []struct {
				elapsed time.Duration
				factor  float64
			}{{0, 0.1}, {slowWindow / 2, 0.5}, {slowWindow / 2, 1}} {
				tb.clock.Advance(at.elapsed)
				tb.settleRamp(t)
				got := tb.share(t, picks, "new")
				want := newcomerShare(at.factor, 4)
				t.Logf("%s: factor %.2f: share %.4f, curve %.4f", rule, at.factor, got, want)
				if math.Abs(got-want) > 0.02 || (rule == RuleRoundRobin && math.Abs(got-want) > 1e-9) {
					t.Errorf("factor %.2f: the newcomer got %.4f of the traffic, want %.4f", at.factor, got, want)
				}
			}
			snap := tb.Snapshot()
			if snap.ramp != nil || snap.full.wt != nil || len(tb.Ramping()) != 0 {
				t.Errorf("after the window: ramp %v, weight table %v, ramping %v: want none", snap.ramp, snap.full.wt, tb.Ramping())
			}
		})
	}
}

// TestSlowStartLoadPerWeight: under BestAvailable, the requests in flight
// of a ramping server follow its live weight.
func TestSlowStartLoadPerWeight(t *testing.T) {
	tb := newTest(t, withSlowStart(RuleBestAvailable), zoned(4, "a"))
	if err := tb.AddServers(Server{ID: "new", Host: "10.9.0.1", Port: 80, Zone: "a"}); err != nil {
		t.Fatal(err)
	}
	for _, at := range []struct {
		elapsed time.Duration
		factor  float64
	}{{0, 0.1}, {slowWindow / 2, 0.5}} {
		tb.clock.Advance(at.elapsed)
		tb.settleRamp(t)
		var picks []Pick
		for range 4100 {
			p, err := tb.Pick(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			picks = append(picks, p)
		}
		got := float64(tb.ServerStats("new").ActiveRequests()) / float64(len(picks))
		want := newcomerShare(at.factor, 4)
		t.Logf("factor %.2f: share of the requests in flight %.4f, curve %.4f", at.factor, got, want)
		if math.Abs(got-want) > 0.02 {
			t.Errorf("factor %.2f: the newcomer holds %.4f of the requests in flight, want %.4f", at.factor, got, want)
		}
		for _, p := range picks {
			p.Done(DoneInfo{ResponseTime: time.Millisecond})
		}
	}
}

// TestSlowStartRestarts: a server that leaves the list and comes back, or
// is listed with another incarnation, ramps again; a weight change or a
// server marked down and up does not.
func TestSlowStartRestarts(t *testing.T) {
	list := servers(4, "a", 0)
	for i := range list {
		list[i].Incarnation = 1
	}
	tb := newTest(t, withSlowStart(RuleRoundRobin), list)
	ramping := func(want ...string) {
		t.Helper()
		tb.settleRamp(t) // a pick wakes the refresher when the weights are due
		got := tb.Ramping()
		if len(got) != len(want) {
			t.Fatalf("ramping %v, want %v", got, want)
		}
		for _, id := range want {
			if _, ok := got[id]; !ok {
				t.Fatalf("ramping %v, want %v", got, want)
			}
		}
	}
	ramping()

	// Leaves, comes back: ramps.
	if err := tb.SetServers(list[1:]); err != nil {
		t.Fatal(err)
	}
	if err := tb.SetServers(list); err != nil {
		t.Fatal(err)
	}
	ramping("s0")
	tb.clock.Advance(slowWindow / 2)
	ramping("s0")
	if f := tb.Ramping()["s0"]; math.Abs(f-0.5) > 1e-9 {
		t.Fatalf("s0 at half the window: factor %v, want 0.5", f)
	}

	// Restarts (a new incarnation) half-way through s0's window: both ramp,
	// s1 from the start.
	list[1].Incarnation = 2
	if err := tb.SetServers(list); err != nil {
		t.Fatal(err)
	}
	ramping("s0", "s1")
	if f := tb.Ramping()["s1"]; f != 0.1 {
		t.Fatalf("restarted s1: factor %v, want 0.1", f)
	}

	// The same incarnation with another weight, and a server marked down
	// and up: the same life, no new ramp.
	tb.clock.Advance(slowWindow)
	ramping()
	list[2].Weight = 300
	if err := tb.SetServers(list); err != nil {
		t.Fatal(err)
	}
	tb.MarkServerDown("s3")
	tb.MarkServerUp("s3")
	ramping()
	if tb.Snapshot().full.wt == nil {
		t.Fatal("no weight table for weights 100 and 300")
	}
}

// TestSlowStartColdStart: the first non-empty list does not ramp, even
// after empty ones; a keyed rule never ramps.
func TestSlowStartColdStart(t *testing.T) {
	tb := newTest(t, withSlowStart(RuleRoundRobin), nil)
	if err := tb.SetServers(nil); err != nil {
		t.Fatal(err)
	}
	if err := tb.SetServers(servers(3, "a", 0)); err != nil {
		t.Fatal(err)
	}
	if r := tb.Ramping(); len(r) != 0 {
		t.Fatalf("cold start ramps: %v", r)
	}
	if err := tb.AddServers(servers(1, "a", 3)...); err != nil {
		t.Fatal(err)
	}
	if r := tb.Ramping(); len(r) != 1 {
		t.Fatalf("a server after the first list: ramping %v", r)
	}

	keyed := newTest(t, withSlowStart(RuleMaglev), servers(3, "a", 0))
	if err := keyed.AddServers(servers(1, "a", 3)...); err != nil {
		t.Fatal(err)
	}
	if r := keyed.Ramping(); len(r) != 0 || keyed.slow != nil {
		t.Fatalf("Maglev ramps: %v", r)
	}
	off := newTest(t, nil, servers(3, "a", 0))
	if err := off.AddServers(servers(1, "a", 3)...); err != nil {
		t.Fatal(err)
	}
	if r := off.Ramping(); len(r) != 0 || off.slow != nil {
		t.Fatalf("slow start off ramps: %v", r)
	}
}

// TestSlowStartRefreshes: the live weights are recomputed after each
// refresh period (window / 20) and at the end of the window, by the
// refresher, which a pick that finds them due wakes; a pick before that
// wakes nothing and changes nothing.
func TestSlowStartRefreshes(t *testing.T) {
	tb := newTest(t, withSlowStart(RuleRoundRobin), servers(4, "a", 0))
	if err := tb.AddServers(servers(1, "a", 4)...); err != nil {
		t.Fatal(err)
	}
	v := tb.Snapshot().Version()
	tb.clock.Advance(2 * time.Second) // before the first refresh (3 s)
	tb.Choose(t.Context())
	if n := tb.settleRamp(t); n != 0 || tb.Snapshot().Version() != v {
		t.Fatalf("refreshed before due: %d refreshes, version %d -> %d", n, v, tb.Snapshot().Version())
	}
	tb.clock.Advance(7 * time.Second) // 9 s
	// One refresh, the one settleRamp waits for, or, when the refresher's
	// first look at the weights comes this late, that one.
	tb.settleRamp(t)
	if f := tb.Ramping()["s4"]; math.Abs(f-0.15) > 1e-9 || tb.Snapshot().Version() != v+1 {
		t.Fatalf("at 9 s: factor %v, version %d: want 0.15, one refresh", f, tb.Snapshot().Version())
	}
	tb.clock.Advance(slowWindow - 9*time.Second - time.Millisecond)
	tb.settleRamp(t)
	if f := tb.Ramping()["s4"]; f >= 1 || f < 0.99 {
		t.Fatalf("just before the end: factor %v", f)
	}
	tb.clock.Advance(time.Millisecond)
	tb.settleRamp(t)
	if r := tb.Ramping(); len(r) != 0 || tb.Snapshot().full.wt != nil {
		t.Fatalf("at the end of the window: ramping %v", r)
	}
}

// TestSlowStartRefresherLifecycle: the refresher runs only while a server
// ramps: none for the first list, one from the list change that starts a
// ramp, gone after the refresh that ends it, a new one for the next ramp,
// and Close stops it (and waits for it) mid-ramp. goleak checks the rest.
func TestSlowStartRefresherLifecycle(t *testing.T) {
	tb := newTest(t, withSlowStart(RuleRoundRobin), servers(4, "a", 0))
	refresher := func() *rampRefresher {
		tb.mu.Lock()
		defer tb.mu.Unlock()
		return tb.slow.refresher
	}
	if r := refresher(); r != nil {
		t.Fatal("a refresher runs with no server ramping")
	}
	if err := tb.AddServers(servers(1, "a", 4)...); err != nil {
		t.Fatal(err)
	}
	first := refresher()
	if first == nil {
		t.Fatal("no refresher while s4 ramps")
	}
	tb.clock.Advance(slowWindow)
	tb.settleRamp(t)
	waitClosed(t, first.done, "the refresher after the last ramp ended")
	if r := refresher(); r != nil {
		t.Fatal("a refresher is still registered after the ramp ended")
	}

	if err := tb.AddServers(servers(1, "a", 5)...); err != nil {
		t.Fatal(err)
	}
	second := refresher()
	if second == nil || second == first {
		t.Fatal("no new refresher for s5's ramp")
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, second.done, "the refresher after Close") // Close waited: closed already
}

// waitClosed waits, bounded, for ch to be closed.
func waitClosed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case <-ch:
	case <-timeout.C:
		t.Fatalf("%s did not stop", what)
	}
}

// TestSlowStartPickNeverWaitsForARefresh: a pick that finds the live
// weights due only wakes the refresher; it answers from the current
// snapshot even while the list lock, which a refresh takes, is held (the
// pick used to rebuild the snapshot itself, under that lock).
func TestSlowStartPickNeverWaitsForARefresh(t *testing.T) {
	tb := newTest(t, withSlowStart(RuleRoundRobin), servers(4, "a", 0))
	if err := tb.AddServers(servers(1, "a", 4)...); err != nil {
		t.Fatal(err)
	}
	snap := tb.Snapshot()
	tb.clock.Advance(slowWindow / 2)
	tb.mu.Lock()
	picked := make(chan error, 1)
	go func() {
		_, err := tb.Choose(t.Context())
		picked <- err
	}()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	select {
	case err := <-picked:
		tb.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	case <-timeout.C:
		tb.mu.Unlock()
		<-picked
		t.Fatal("a pick waited for the list lock to refresh the live weights")
	}
	waitClosed(t, snap.replaced, "the refresh the pick asked for")
	if f := tb.Ramping()["s4"]; math.Abs(f-0.5) > 1e-9 {
		t.Fatalf("after the refresh: factor %v, want 0.5", f)
	}
}

// TestSlowStartPicksAllocateNothing: while a server ramps, picks between
// refreshes allocate nothing.
func TestSlowStartPicksAllocateNothing(t *testing.T) {
	for _, rule := range []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance, RuleLeastRequest} {
		tb := newTest(t, withSlowStart(rule), zoned(3, "a", "b"))
		if err := tb.AddServers(Server{ID: "new", Host: "10.9.0.1", Port: 80, Zone: "a"}); err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		if n := testing.AllocsPerRun(1000, func() { tb.Choose(ctx) }); n != 0 {
			t.Errorf("%s: %v allocations per ramping pick", rule, n)
		}
	}
}

// TestSlowStartConcurrentPicks: picks from several goroutines while the
// clock runs through the window and the refresher swaps snapshots under
// them (run with -race).
func TestSlowStartConcurrentPicks(t *testing.T) {
	tb := newTest(t, withSlowStart(RuleZoneAvoidance), zoned(3, "a", "b"))
	if err := tb.AddServers(Server{ID: "new", Host: "10.9.0.1", Port: 80, Zone: "a"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var picked atomic.Int64
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := tb.Pick(t.Context())
				if err != nil {
					t.Error(err)
					return
				}
				p.Done(DoneInfo{ResponseTime: time.Millisecond})
				picked.Add(1)
			}
		})
	}
	for range 25 {
		tb.clock.Advance(slowWindow / 20)
		// Each step waits for picks over it, counted, not for time.
		for from := picked.Load(); picked.Load() < from+100; {
			runtime.Gosched()
		}
	}
	close(stop)
	wg.Wait()
	tb.settleRamp(t)
	if r := tb.Ramping(); len(r) != 0 {
		t.Fatalf("after the window: ramping %v", r)
	}
}
