package serverlist_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

func TestLookupConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	l, err := serverlist.NewLookup(e.reg, nil, serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Config(); got != serverlist.DefaultLookupConfig() {
		t.Fatalf("Config() = %+v", got)
	}
	for _, cfg := range []serverlist.LookupConfig{{Attempts: -1}, {InitialBackoff: -1}, {MaxBackoff: -1}, {AttemptTimeout: -1}} {
		if _, err := serverlist.NewLookup(e.reg, nil, cfg); !errors.Is(err, serverlist.ErrInvalidConfig) {
			t.Errorf("NewLookup(%+v) = %v", cfg, err)
		}
	}
	if _, err := serverlist.NewLookup(nil, nil, serverlist.LookupConfig{}); !errors.Is(err, serverlist.ErrInvalidConfig) {
		t.Errorf("NewLookup(nil registry) = %v", err)
	}
}

func TestLookupHit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	in := inst("orders", "10.0.0.1:orders:9001", 9001)
	register(t, e.reg, in)
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	l, err := serverlist.NewLookup(e.reg, m, serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.Resolve(testCtx(t, time.Second), "orders", in.InstanceID)
	if err != nil || !got.Equal(in) {
		t.Fatalf("Resolve = %+v, %v", got, err)
	}
	if st := l.Stats(); st != (serverlist.LookupStats{Hits: 1}) {
		t.Fatalf("Stats = %+v", st)
	}
}

// TestLookupFallback resolves an ID the mirror does not hold yet: the mirror
// here is never started, so every resolution is a miss that the registry
// answers.
func TestLookupFallback(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	in := inst("orders", "not.yet:mirrored", 9001)
	register(t, e.reg, in)
	lagging := serverlist.NewMirror(e.reg, serverlist.MirrorConfig{})
	for _, m := range []*serverlist.Mirror{lagging, nil} {
		l, err := serverlist.NewLookup(e.reg, m, serverlist.LookupConfig{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := l.Resolve(testCtx(t, 2*time.Second), "orders", in.InstanceID)
		if err != nil || !got.Equal(in) {
			t.Fatalf("Resolve = %+v, %v", got, err)
		}
		if st := l.Stats(); st != (serverlist.LookupStats{Misses: 1, Fallbacks: 1, RegistryReads: 1}) {
			t.Fatalf("Stats = %+v", st)
		}
	}
}

// TestLookupRetriesUntilRegistered registers the instance while the lookup
// is already retrying, as when an event outruns the registry put.
func TestLookupRetriesUntilRegistered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	l, err := serverlist.NewLookup(e.reg, nil, serverlist.LookupConfig{Attempts: 20, InitialBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	in := inst("orders", "late", 1)
	type result struct {
		in  serverlist.Instance
		err error
	}
	done := make(chan result, 1)
	go func() {
		in, err := l.Resolve(testCtx(t, 10*time.Second), "orders", "late")
		done <- result{in, err}
	}()
	// Register only once a read has missed: the lookup is retrying.
	testutil.Eventually(t, "a first registry read", func() bool { return l.Stats().RegistryReads >= 1 })
	register(t, e.reg, in)
	r := <-done // bounded by Resolve's ctx
	if r.err != nil || !r.in.Equal(in) {
		t.Fatalf("Resolve = %+v, %v", r.in, r.err)
	}
	if st := l.Stats(); st.RegistryReads < 2 || st.Fallbacks != 1 || st.Misses != 1 {
		t.Fatalf("Stats = %+v, want a fallback after at least two reads", st)
	}
}

func TestLookupUnknownFailsFast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	l, err := serverlist.NewLookup(e.reg, m, serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.Resolve(testCtx(t, 5*time.Second), "orders", "ghost")
	elapsed := time.Since(start)
	// It gives up after its attempts, not at its ctx's deadline.
	if !errors.Is(err, serverlist.ErrNotFound) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Resolve(ghost) = %v, want ErrNotFound", err)
	}
	// Default backoff waits 5+10+20 ms between the reads.
	if elapsed < 35*time.Millisecond {
		t.Fatalf("Resolve(ghost) took %v, less than its backoff", elapsed)
	}
	t.Logf("unknown ID failed after %v", elapsed)
	if st := l.Stats(); st != (serverlist.LookupStats{Misses: 1, Failures: 1, RegistryReads: serverlist.DefaultLookupAttempts}) {
		t.Fatalf("Stats = %+v", st)
	}

	// Invalid IDs fail at once, without a read or a retry.
	reads := l.Stats().RegistryReads
	if _, err := l.Resolve(testCtx(t, time.Second), "orders", ""); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Resolve(empty) = %v", err)
	}
	if st := l.Stats(); st.RegistryReads != reads {
		t.Fatalf("an invalid ID cost %d registry reads", st.RegistryReads-reads)
	}
}

// TestLookupHonoursContext: a lookup that retries stops when its ctx ends,
// and its error carries both the ctx's error and the last read's
// ErrNotFound. The ctx is cancelled once a read has answered, so that the
// error has a last read to carry whatever the machine's load.
func TestLookupHonoursContext(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	// Ignoring ctx would retry for about 1,000 s.
	l, err := serverlist.NewLookup(e.reg, nil, serverlist.LookupConfig{Attempts: 1000, InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Resolve(ctx, "orders", "ghost")
		done <- err
	}()
	testutil.Eventually(t, "a first registry read", func() bool { return l.Stats().RegistryReads >= 1 })
	cancel()
	err = testutil.Receive(t, done, 10*time.Second, "Resolve to return after its ctx ended")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Resolve = %v, want Canceled", err)
	}
	if !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("Resolve = %v, should also carry the last ErrNotFound", err)
	}
}

func TestLookupResolveAll(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	a := inst("orders", "a", 1)
	register(t, e.reg, a)
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	// b is registered after the mirror was closed: a fallback.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	b := inst("orders", "b", 2)
	register(t, e.reg, b)
	l, err := serverlist.NewLookup(e.reg, m, serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.ResolveAll(testCtx(t, 5*time.Second), "orders", []string{"ghost1", "b", "a", "ghost2"})
	if ids := instanceIDs(got); !slices.Equal(ids, []string{"b", "a"}) {
		t.Fatalf("ResolveAll = %v", ids)
	}
	if !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("ResolveAll err = %v", err)
	}
	if st := l.Stats(); st != (serverlist.LookupStats{Hits: 1, Misses: 3, Fallbacks: 1, Failures: 2,
		RegistryReads: 2*serverlist.DefaultLookupAttempts + 1}) {
		t.Fatalf("Stats = %+v", st)
	}
	got, err = l.ResolveAll(testCtx(t, time.Second), "orders", []string{"a"})
	if err != nil || len(got) != 1 {
		t.Fatalf("ResolveAll(a) = %v, %v", got, err)
	}
	if got, err := l.ResolveAll(testCtx(t, time.Second), "orders", nil); err != nil || len(got) != 0 {
		t.Fatalf("ResolveAll(nil) = %v, %v", got, err)
	}
}

// An ID found absent is remembered: the next resolution is a map read,
// until the mirror holds the ID, which wins at once.
func TestLookupNegativeCache(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	l, err := serverlist.NewLookup(e.reg, m, serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 5*time.Second)
	if _, err := l.Resolve(ctx, "orders", "late"); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatal(err)
	}
	reads := l.Stats().RegistryReads
	if _, err := l.Resolve(ctx, "orders", "late"); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatal(err)
	}
	if st := l.Stats(); st.RegistryReads != reads || st.NegativeHits != 1 {
		t.Fatalf("second miss: %+v, want no read and one negative hit", st)
	}
	in := inst("orders", "late", 9001)
	rev := register(t, e.reg, in)
	testutil.Eventually(t, "the mirror to apply the registration", func() bool { return m.Stats().Revision >= rev })
	got, err := l.Resolve(ctx, "orders", "late")
	if err != nil || !got.Equal(in) {
		t.Fatalf("after registration: %+v, %v", got, err)
	}
}

// A list of thousands of IDs nobody registered costs one backoff schedule
// and a bounded number of registry reads, not a retry dance per ID.
func TestLookupFloodIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	real := inst("orders", "real", 9001)
	rev := register(t, e.reg, real)
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	testutil.Eventually(t, "the mirror", func() bool { return m.Stats().Revision >= rev })
	l, err := serverlist.NewLookup(e.reg, m, serverlist.LookupConfig{ReadsPerSecond: 20})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"real"}
	for i := range 2000 {
		ids = append(ids, fmt.Sprintf("invented-%d", i))
	}
	found, errs := l.ResolveEach(testCtx(t, 10*time.Second), "orders", ids)
	if errs[0] != nil || !found[0].Equal(real) {
		t.Fatalf("the real instance: %+v, %v", found[0], errs[0])
	}
	for i, err := range errs[1:] {
		if !errors.Is(err, serverlist.ErrNotFound) {
			t.Fatalf("invented %d: %v", i, err)
		}
	}
	st := l.Stats()
	// 20 tokens at most, plus what refills while the backoff (35 ms) runs.
	if st.RegistryReads > 25 || st.RateLimited < 1900 {
		t.Fatalf("flood stats %+v: want at most ~20 reads, the rest rate-limited", st)
	}
	t.Logf("2,000 invented IDs: %d registry reads, %d rate-limited", st.RegistryReads, st.RateLimited)
}
