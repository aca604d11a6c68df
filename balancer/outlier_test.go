package balancer

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// serverErrors reports n server errors from server id through picks made
// for it, as lbhttp reports a 5xx.
func (tb *testBalancer) serverErrors(t testing.TB, id string, n int) {
	t.Helper()
	s := tb.Server(id)
	if s == nil {
		t.Fatalf("no server %q", id)
	}
	for range n {
		tb.Begin(s).Done(DoneInfo{ResponseTime: time.Millisecond, ServerError: true})
	}
}

func outlierOn(c *Config) {
	c.OutlierDetection.Consecutive5xx = 5
	c.OutlierDetection.MaxEjectionPercent = 50
	c.Filter = FilterNone
}

// TestOutlierEjection: five server errors in a row eject a server from
// every rule's picks (RoundRobin ignores the breaker, not ejections), for
// the base ejection time, then it comes back; a good answer in between
// resets the count; a second ejection lasts twice as long.
func TestOutlierEjection(t *testing.T) {
	for _, rule := range []string{RuleRoundRobin, RuleRandom, RuleZoneAvoidance, RuleBestAvailable, RuleLeastRequest, RuleWeightedResponseTime} {
		t.Run(rule, func(t *testing.T) {
			tb := newTest(t, func(c *Config) { outlierOn(c); c.Rule = rule }, servers(3, "a", 0))
			for _, s := range tb.AllServers() { // equal response times, for WeightedResponseTime
				tb.Begin(s).Done(DoneInfo{ResponseTime: time.Millisecond})
			}
			st := tb.ServerStats("s1")
			tb.serverErrors(t, "s1", 4)
			tb.Begin(tb.Server("s1")).Done(DoneInfo{ResponseTime: time.Millisecond}) // resets
			tb.serverErrors(t, "s1", 4)
			if st.Ejected() {
				t.Fatal("ejected after 4 errors, a good answer, and 4 errors")
			}
			tb.serverErrors(t, "s1", 1)
			if !st.Ejected() || tb.Ejections() != 1 {
				t.Fatalf("not ejected after 5 errors in a row (ejections %d)", tb.Ejections())
			}
			if c := tb.pickCounts(t, 300); c["s1"] != 0 || c["s0"] == 0 || c["s2"] == 0 {
				t.Fatalf("picks while s1 is ejected: %v", c)
			}
			tb.clock.Advance(30 * time.Second)
			if st.Ejected() {
				t.Fatal("still ejected after the base ejection time")
			}
			if c := tb.pickCounts(t, 300); c["s1"] == 0 {
				t.Fatalf("s1 gets nothing after its ejection ended: %v", c)
			}
			tb.serverErrors(t, "s1", 5)
			if got := st.EjectionRemaining(); got != 60*time.Second {
				t.Fatalf("second ejection lasts %v, want 60s", got)
			}
		})
	}
}

// TestOutlierEjectionLimit: no more than MaxEjectionPercent of the
// servers are ejected at once, but one always may be; a service of one
// server keeps it however it answers.
func TestOutlierEjectionLimit(t *testing.T) {
	tb := newTest(t, func(c *Config) { outlierOn(c); c.OutlierDetection.MaxEjectionPercent = 10 }, servers(4, "a", 0))
	tb.serverErrors(t, "s0", 5)
	tb.serverErrors(t, "s1", 5)
	if !tb.ServerStats("s0").Ejected() || tb.ServerStats("s1").Ejected() {
		t.Fatalf("10%% of 4: want s0 ejected (one always may be) and s1 not, got %v %v",
			tb.ServerStats("s0").Ejected(), tb.ServerStats("s1").Ejected())
	}
	tb.clock.Advance(30 * time.Second)
	tb.serverErrors(t, "s1", 1) // its count stayed at the limit: the next error ejects it
	if !tb.ServerStats("s1").Ejected() {
		t.Fatal("s1 not ejected once s0's ejection ended")
	}

	one := newTest(t, outlierOn, servers(1, "a", 0))
	one.serverErrors(t, "s0", 5)
	if s, err := one.Choose(t.Context()); err != nil || s.ID != "s0" {
		t.Fatalf("a service of one ejected server: %v, %v; want s0 still chosen", s, err)
	}
}

// TestOutlierOffByDefault: without Consecutive5xx, server errors eject
// nothing, and a pick reads no ejection state.
func TestOutlierOffByDefault(t *testing.T) {
	tb := newTest(t, nil, servers(3, "a", 0))
	tb.serverErrors(t, "s1", 50)
	if tb.ServerStats("s1").Ejected() || tb.Ejections() != 0 {
		t.Fatal("ejected with outlier detection off")
	}
}

// TestServerErrorIsAnAnswer: a server error closes a breaker (the server
// answered) and its response time counts.
func TestServerErrorIsAnAnswer(t *testing.T) {
	tb := newTest(t, outlierOn, servers(2, "a", 0))
	tb.trip(t, "s0")
	tb.serverErrors(t, "s0", 1)
	st := tb.ServerStats("s0")
	if st.CircuitTripped() || st.SuccessiveFailures() != 0 {
		t.Fatal("a server error left the breaker open")
	}
	if rt, ok := st.ResponseTime(); !ok || rt != time.Millisecond {
		t.Fatalf("response time %v, %v", rt, ok)
	}
}

// TestPanicThreshold: with half the servers tripped and a threshold of
// 50 %, picks go to every server and the listener hears of it; once the
// blackouts end the balancer leaves panic; without a threshold (the
// default) the tripped servers stay skipped, as Ribbon's rules do.
func TestPanicThreshold(t *testing.T) {
	var entered, left atomic.Int32
	var last [2]int
	listener := WithPanicListener(func(b *Balancer, panic bool, healthy, alive int) {
		if panic {
			entered.Add(1)
		} else {
			left.Add(1)
		}
		last = [2]int{healthy, alive}
	})
	tb := newTest(t, func(c *Config) { c.PanicThreshold = 50 }, servers(4, "a", 0), listener)
	tb.trip(t, "s0")
	if tb.Panicking() {
		t.Fatal("in panic with 3 of 4 healthy")
	}
	tb.trip(t, "s1", "s2")
	if !tb.Panicking() || entered.Load() != 1 || last != [2]int{1, 4} {
		t.Fatalf("1 of 4 healthy: panicking %v, entered %d, counts %v", tb.Panicking(), entered.Load(), last)
	}
	if c := tb.pickCounts(t, 400); len(c) != 4 {
		t.Fatalf("in panic want every server picked, got %v", c)
	}
	tb.clock.Advance(time.Minute) // every blackout over
	if c := tb.pickCounts(t, 40); len(c) != 4 || tb.Panicking() || left.Load() != 1 {
		t.Fatalf("after the blackouts: %v, panicking %v, left %d", c, tb.Panicking(), left.Load())
	}

	ribbon := newTest(t, nil, servers(4, "a", 0))
	ribbon.trip(t, "s0", "s1", "s2")
	if c := ribbon.pickCounts(t, 100); c["s3"] != 100 || ribbon.Panicking() {
		t.Fatalf("no threshold: want every pick on s3, got %v (panicking %v)", c, ribbon.Panicking())
	}
}

// TestPanicCountsEjections: ejected servers are unhealthy for the panic
// threshold, and in panic they are picked again.
func TestPanicCountsEjections(t *testing.T) {
	tb := newTest(t, func(c *Config) {
		outlierOn(c)
		c.OutlierDetection.MaxEjectionPercent = 100
		c.PanicThreshold = 60
		c.Rule = RuleRoundRobin
	}, servers(2, "a", 0))
	tb.serverErrors(t, "s0", 5)
	if !tb.Panicking() {
		t.Fatal("1 of 2 healthy under a 60 % threshold: not in panic")
	}
	if c := tb.pickCounts(t, 100); c["s0"] == 0 {
		t.Fatalf("in panic an ejected server is picked again: %v", c)
	}
}

func TestOutlierConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Config)
		field  string
	}{
		{func(c *Config) { c.OutlierDetection.Consecutive5xx = -1 }, "outlierDetection.consecutive5xx"},
		{func(c *Config) { c.OutlierDetection.Consecutive5xx = 5; c.OutlierDetection.BaseEjectionTime = 0 }, "outlierDetection.baseEjectionTime"},
		{func(c *Config) {
			c.OutlierDetection.Consecutive5xx = 5
			c.OutlierDetection.MaxEjectionTime = time.Second
		}, "outlierDetection.maxEjectionTime"},
		{func(c *Config) { c.OutlierDetection.MaxEjectionPercent = 101 }, "outlierDetection.maxEjectionPercent"},
		{func(c *Config) { c.PanicThreshold = -5 }, "panicThreshold"},
	} {
		cfg := DefaultConfig()
		tc.mutate(&cfg)
		err := cfg.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("want an error naming %s, got %v", tc.field, err)
		}
	}
}

// TestOutlierCountersLazy: a server's outlier counters exist only once
// outlier detection counted a server error of it. Without outlier
// detection server errors allocate none and every counter reads 0; with
// it, good answers allocate none, the first server error does, and the
// ejection at Consecutive5xx, its end and a second, longer ejection work
// as with counters allocated up front, also when the first errors arrive
// from many goroutines at once.
func TestOutlierCountersLazy(t *testing.T) {
	off := newTest(t, func(c *Config) { c.Filter = FilterNone }, servers(2, "a", 0))
	off.serverErrors(t, "s0", 10)
	st := off.ServerStats("s0")
	if st.outlier.Load() != nil || st.SuccessiveServerErrors() != 0 || st.Ejected() || st.EjectionRemaining() != 0 {
		t.Fatalf("outlier detection off: counters %v, errors %d, ejected %v", st.outlier.Load(), st.SuccessiveServerErrors(), st.Ejected())
	}

	tb := newTest(t, outlierOn, servers(4, "a", 0))
	for _, s := range tb.AllServers() {
		tb.Begin(s).Done(DoneInfo{ResponseTime: time.Millisecond})
		if s.Stats().outlier.Load() != nil {
			t.Fatalf("%s: counters allocated by a good answer", s.ID)
		}
	}
	st = tb.ServerStats("s1")
	s1 := tb.Server("s1")
	var wg sync.WaitGroup
	for range 4 { // four errors from four goroutines: one set of counters
		wg.Go(func() { tb.Begin(s1).Done(DoneInfo{ResponseTime: time.Millisecond, ServerError: true}) })
	}
	wg.Wait()
	if got := st.SuccessiveServerErrors(); got != 4 || st.Ejected() {
		t.Fatalf("after 4 errors: %d in a row, ejected %v; want 4, not ejected", got, st.Ejected())
	}
	tb.serverErrors(t, "s1", 1)
	if !st.Ejected() || st.EjectionRemaining() != 30*time.Second || st.SuccessiveServerErrors() != 0 {
		t.Fatalf("after 5 errors: ejected %v for %v, %d in a row; want ejected for 30s, 0", st.Ejected(), st.EjectionRemaining(), st.SuccessiveServerErrors())
	}
	for id, n := range tb.pickCounts(t, 300) {
		if id == "s1" && n > 0 {
			t.Fatalf("ejected s1 picked %d times", n)
		}
	}
	if others := tb.ServerStats("s2"); others.outlier.Load() != nil {
		t.Fatal("s2: counters allocated without a server error")
	}
	tb.clock.Advance(30 * time.Second)
	if st.Ejected() {
		t.Fatal("still ejected after the base ejection time")
	}
	tb.serverErrors(t, "s1", 5)
	if got := st.EjectionRemaining(); got != 60*time.Second {
		t.Fatalf("second ejection lasts %v, want 60s", got)
	}
}
