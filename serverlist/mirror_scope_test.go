package serverlist_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// follow follows service on m, failing the test on error.
func follow(t testing.TB, m *serverlist.Mirror, service string) {
	t.Helper()
	if err := m.Follow(testCtx(t, 5*time.Second), service); err != nil {
		t.Fatalf("Follow(%s): %v", service, err)
	}
}

// waitServiceApplied waits until m has applied service's entries up to
// rev.
func waitServiceApplied(t testing.TB, m *serverlist.Mirror, service string, rev uint64) {
	t.Helper()
	testutil.Eventually(t, "the mirror to apply "+service, func() bool { return m.ServiceRevision(service) >= rev })
}

// TestScopedMirrorIsSentOnlyFollowedServices: a scoped mirror holds the
// records of the services it follows and is sent nothing of the others.
// Each watch delivers its entries in order, so a write to an unfollowed
// service made before a write to a followed one would arrive first if the
// mirror were sent it: the Puts counter after the second proves it was not.
func TestScopedMirrorIsSentOnlyFollowedServices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	register(t, e.reg, inst("orders", "a1", 1), inst("orders", "a2", 2), inst("billing", "b1", 3))

	var ch changes
	m := startMirror(t, e.reg, serverlist.MirrorConfig{Scoped: true, OnChange: ch.record})
	if got := m.Services(); len(got) != 0 {
		t.Fatalf("a scoped mirror that follows nothing holds %v", got)
	}
	follow(t, m, "orders")
	if got := instanceIDs(m.Service("orders")); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("Service(orders) right after Follow = %v, want the full list [a1 a2]", got)
	}
	if got := m.Services(); !slices.Equal(got, []string{"orders"}) {
		t.Fatalf("Services() = %v, want [orders]", got)
	}
	if n := ch.count("orders"); n != 1 {
		t.Fatalf("OnChange(orders) called %d times by its first sync, want 1", n)
	}

	register(t, e.reg, inst("billing", "b2", 4))
	waitServiceApplied(t, m, "orders", register(t, e.reg, inst("orders", "a3", 5)))
	st := m.Stats()
	if st.Puts != 3 || st.Instances != 3 {
		t.Fatalf("stats after a billing and an orders write = %+v, want 3 puts and 3 instances (orders' only)", st)
	}
	if _, ok := m.Get("billing", "b1"); ok || ch.count("billing") != 0 {
		t.Fatal("the mirror holds or reported an unfollowed service")
	}

	// Following a second service brings its full state at once.
	follow(t, m, "billing")
	if got := instanceIDs(m.Service("billing")); !slices.Equal(got, []string{"b1", "b2"}) {
		t.Fatalf("Service(billing) right after Follow = %v", got)
	}
	if got := m.Followed(); !slices.Equal(got, []string{"billing", "orders"}) {
		t.Fatalf("Followed() = %v", got)
	}

	// Unfollowed, a service leaves the index and its writes stop coming.
	calls := ch.count("orders")
	m.Unfollow("orders")
	testutil.Eventually(t, "orders to leave the mirror", func() bool { return len(m.Service("orders")) == 0 })
	if m.ServiceRevision("orders") != 0 {
		t.Fatalf("ServiceRevision of an unfollowed service = %d, want 0", m.ServiceRevision("orders"))
	}
	puts := m.Stats().Puts
	register(t, e.reg, inst("orders", "a4", 6))
	waitServiceApplied(t, m, "billing", register(t, e.reg, inst("billing", "b3", 7)))
	if st := m.Stats(); st.Puts != puts+1 || st.Instances != 3 {
		t.Fatalf("after an orders and a billing write: %+v, want one more put (billing's) and 3 instances", st)
	}
	if n := ch.count("orders"); n != calls {
		t.Fatalf("Unfollow called OnChange(orders): %d calls, %d before", n, calls)
	}

	// Followed again, it comes back with everything written meanwhile.
	follow(t, m, "orders")
	if got := instanceIDs(m.Service("orders")); !slices.Equal(got, []string{"a1", "a2", "a3", "a4"}) {
		t.Fatalf("Service(orders) after a new Follow = %v", got)
	}
}

// TestScopedMirrorFollowUnknownAndInvalid: following a service nobody
// registered syncs with nothing (a later registration shows up); an
// invalid name is refused; a Follow after Close says so.
func TestScopedMirrorFollowUnknownAndInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	m := startMirror(t, e.reg, serverlist.MirrorConfig{Scoped: true})
	follow(t, m, "ghost")
	if got := m.Service("ghost"); len(got) != 0 {
		t.Fatalf("Service(ghost) = %v", got)
	}
	waitServiceApplied(t, m, "ghost", register(t, e.reg, inst("ghost", "g1", 1)))
	if _, ok := m.Get("ghost", "g1"); !ok {
		t.Fatal("a registration of a followed service was not applied")
	}
	for _, bad := range []string{"", "a.b", "*", ">", "a b"} {
		if err := m.Follow(testCtx(t, time.Second), bad); !errors.Is(err, events.ErrInvalidService) {
			t.Errorf("Follow(%q) = %v, want ErrInvalidService", bad, err)
		}
	}
	m.Close()
	if err := m.Follow(testCtx(t, time.Second), "late"); !errors.Is(err, serverlist.ErrClosed) {
		t.Fatalf("Follow after Close = %v, want ErrClosed", err)
	}
}

// TestScopedMirrorFollowBeforeStart: services followed before Start are
// part of the first sync.
func TestScopedMirrorFollowBeforeStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	register(t, e.reg, inst("orders", "a1", 1), inst("billing", "b1", 2))
	m := serverlist.NewMirror(e.reg, serverlist.MirrorConfig{Scoped: true})
	t.Cleanup(func() { m.Close() })
	ctx := testCtx(t, 5*time.Second)
	done := make(chan error, 1)
	go func() { done <- m.Follow(ctx, "orders") }()
	testutil.Eventually(t, "the follow to be recorded", func() bool { return slices.Equal(m.Followed(), []string{"orders"}) })
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if got := instanceIDs(m.Service("orders")); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("Service(orders) at the first sync = %v", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("Follow before Start: %v", err)
	}
}

// TestScopedMirrorResyncsAfterRestart: after the NATS server comes back,
// every followed service resyncs, with what changed while it was away.
func TestScopedMirrorResyncsAfterRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 20*time.Second)
	register(t, e.reg, inst("orders", "a1", 1), inst("orders", "a2", 2), inst("billing", "b1", 3))
	var ch changes
	m := startMirror(t, e.reg, serverlist.MirrorConfig{Scoped: true, OnChange: ch.record, RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	follow(t, m, "orders")
	follow(t, m, "billing")
	syncs := m.Stats().Syncs

	e.srv.Shutdown()
	testutil.Eventually(t, "the connection to see the server go", func() bool { return !e.js.Conn().IsConnected() })
	if len(m.Service("orders")) != 2 {
		t.Fatal("a scoped mirror lost its state while disconnected")
	}
	e.srv.Restart(t)
	retry(t, ctx, func(ctx context.Context) error { return e.reg.Deregister(ctx, "orders", "a1") })
	testutil.Eventually(t, "the removal made after the restart", func() bool {
		return slices.Equal(instanceIDs(m.Service("orders")), []string{"a2"})
	})
	testutil.Eventually(t, "both services to resync", func() bool { return m.Stats().Syncs >= syncs+2 })
	if got := instanceIDs(m.Service("billing")); !slices.Equal(got, []string{"b1"}) {
		t.Fatalf("billing after the restart = %v", got)
	}
}

// TestRegistryMayHold: a service nothing was ever written for is known
// absent with one request; a registered one, or one whose records were
// removed (their markers stay), may be held.
func TestRegistryMayHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 5*time.Second)
	register(t, e.reg, inst("orders", "a1", 1), inst("gone", "g1", 2))
	if err := e.reg.Deregister(ctx, "gone", "g1"); err != nil {
		t.Fatal(err)
	}
	for service, want := range map[string]bool{"orders": true, "gone": true, "ghost": false, "order": false} {
		if got, err := e.reg.MayHold(ctx, service); err != nil || got != want {
			t.Errorf("MayHold(%s) = %v, %v; want %v", service, got, err, want)
		}
	}
	if _, err := e.reg.MayHold(ctx, "a.*"); !errors.Is(err, events.ErrInvalidService) {
		t.Errorf("MayHold of an invalid name = %v", err)
	}
}

// TestServiceRevisionAgreesAcrossMirrors: a scoped mirror and one of
// every record report the same revision for a service once they applied
// its entries: the revision of its last write, a removal included, not
// the other services'.
func TestServiceRevisionAgreesAcrossMirrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 5*time.Second)
	register(t, e.reg, inst("orders", "a1", 1), inst("orders", "a2", 2))
	all := startMirror(t, e.reg, serverlist.MirrorConfig{})
	scoped := startMirror(t, e.reg, serverlist.MirrorConfig{Scoped: true, Services: []string{"orders"}})
	if a, s := all.ServiceRevision("orders"), scoped.ServiceRevision("orders"); a == 0 || a != s {
		t.Fatalf("after the first sync: %d (all) and %d (scoped)", a, s)
	}
	if err := e.reg.Deregister(ctx, "orders", "a1"); err != nil {
		t.Fatal(err)
	}
	last := register(t, e.reg, inst("billing", "b1", 3))
	waitApplied(t, all, last)
	testutil.Eventually(t, "the scoped mirror to apply the removal", func() bool { _, ok := scoped.Get("orders", "a1"); return !ok })
	a, s := all.ServiceRevision("orders"), scoped.ServiceRevision("orders")
	if a != s || a >= last || a == 0 {
		t.Fatalf("after a removal of orders and a write of billing at %d: orders at %d (all) and %d (scoped); want equal, below %d", last, a, s, last)
	}
	if got := all.ServiceRevision("billing"); got != last {
		t.Fatalf("billing's revision %d, want %d", got, last)
	}
	if got := scoped.ServiceRevision("billing"); got != 0 {
		t.Fatalf("the scoped mirror reports %d for billing, which it does not follow", got)
	}
}
