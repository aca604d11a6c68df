package balancer

import (
	"context"
	"testing"
	"time"
)

// TestCoarseClockLifecycle: the coarse clock's goroutine runs while a
// started balancer on the system clock is open and stops with the last
// one; a reading while it ticks is at most a few ticks behind the system
// clock, and never ahead of it.
func TestCoarseClockLifecycle(t *testing.T) {
	base := coarseUsers() // balancers other tests left open
	a := newStarted(t)
	b := newStarted(t)
	if !a.shared.coarse.Load() || !b.shared.coarse.Load() {
		t.Fatal("a started balancer on the system clock does not read the coarse clock")
	}
	// The first reading wakes it; wait for it to tick.
	for !coarse.ticking.Load() {
		a.shared.coarseNanotime()
		waitTick(t)
	}
	for range 100 {
		before := sinceProcessBase()
		c := a.shared.coarseNanotime()
		after := sinceProcessBase()
		if c > after {
			t.Fatalf("coarse time %d ahead of the system clock %d", c, after)
		}
		if before-c > int64(time.Second) {
			t.Fatalf("coarse time %v behind the system clock", time.Duration(before-c))
		}
	}
	a.Close()
	if !b.shared.coarse.Load() {
		t.Fatal("closing one balancer turned the other's coarse clock off")
	}
	if users := coarseUsers() - base; users != 1 {
		t.Fatalf("users = %d after one of two closed, want 1", users)
	}
	b.Close()
	if users := coarseUsers() - base; users != 0 {
		t.Fatalf("users = %d after both closed", users)
	}
	if base == 0 && coarse.ticking.Load() {
		t.Fatal("the coarse clock ticks with no user")
	}
	b.Close() // idempotent: releases once
	if b.shared.coarse.Load() {
		t.Fatal("a closed balancer still reads the coarse clock")
	}
}

// TestCoarseClockGoesIdle: a tick that nobody reads stops the ticking;
// the next reading wakes it again.
func TestCoarseClockGoesIdle(t *testing.T) {
	a := newStarted(t)
	defer a.Close()
	for !coarse.ticking.Load() {
		a.shared.coarseNanotime()
		waitTick(t)
	}
	for coarse.ticking.Load() {
		waitTick(t) // unread ticks
	}
	for !coarse.ticking.Load() {
		a.shared.coarseNanotime()
		waitTick(t)
	}
}

// TestUntimedPick: under WithoutPickTiming a Done without a response time
// records none, one with a response time records it, and both end the
// request and reset the failure count.
func TestUntimedPick(t *testing.T) {
	b, err := New("svc", DefaultConfig(), WithoutPickTiming())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.SetServers([]Server{{Host: "10.0.0.1", Port: 80}}); err != nil {
		t.Fatal(err)
	}
	st := b.AllServers()[0].Stats()
	p, err := b.Pick(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.ActiveRequests() != 1 {
		t.Fatalf("active = %d, want 1", st.ActiveRequests())
	}
	st.noteConnectionFailure()
	p.Done(DoneInfo{})
	if _, ok := st.ResponseTime(); ok || st.ActiveRequests() != 0 || st.SuccessiveFailures() != 0 {
		rt, _ := st.ResponseTime()
		t.Fatalf("untimed answer: response time %v (%v), active %d, failures %d", rt, ok, st.ActiveRequests(), st.SuccessiveFailures())
	}
	p, _ = b.Pick(context.Background())
	p.Done(DoneInfo{ResponseTime: 3 * time.Millisecond})
	if rt, ok := st.ResponseTime(); !ok || rt != 3*time.Millisecond || st.ActiveRequests() != 0 {
		t.Fatalf("answer with a time: response time %v (%v), active %d", rt, ok, st.ActiveRequests())
	}
	p, _ = b.Pick(context.Background())
	p.Responded(0)
	p.End()
	if rt, _ := st.ResponseTime(); rt != 3*time.Millisecond || st.ActiveRequests() != 0 {
		t.Fatalf("untimed Responded changed the response time to %v (active %d)", rt, st.ActiveRequests())
	}
}

func coarseUsers() int {
	coarse.mu.Lock()
	defer coarse.mu.Unlock()
	return coarse.users
}

func newStarted(t *testing.T) *Balancer {
	t.Helper()
	b, err := New("svc", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

// waitTick waits for one coarse tick of the system's timers.
func waitTick(t *testing.T) {
	t.Helper()
	<-time.After(coarseTick)
}
