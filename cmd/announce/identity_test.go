package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/subscriber"
)

// gatewayView is a subscriber over the world's NATS server: the live set a
// gateway would route.
func gatewayView(t *testing.T, w *world) *subscriber.Subscriber {
	t.Helper()
	sub, err := subscriber.New(w.srv.Connect(t), w.reg, func(context.Context, events.ListChanged) error { return nil }, subscriber.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub
}

// TestDuplicateAnnounceIsRefused: a second announce for an ID a live one
// holds exits 1 with a clear error, publishes and writes nothing, and when
// it is gone the original is still registered and routed, and keeps its
// lease.
func TestDuplicateAnnounceIsRefused(t *testing.T) {
	t.Parallel()
	w := newWorldTTL(t, natstest.Start(t), 3*time.Second)
	sub := gatewayView(t, w)
	addr := testutil.FreeAddr(t)
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	start(t, backendBin, "-addr", addr).WaitFor(t, "listening on", lineTimeout)
	orig := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr)
	on := w.next(t)
	expectKind(t, on, events.Online, id)

	dup := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-zone", "other")
	if code := dup.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("duplicate: exit status %d, want 1; stderr:\n%s", code, dup.Stderr())
	}
	if !strings.Contains(dup.Stderr(), "in use by another live process") || !strings.Contains(dup.Stderr(), "-replace") {
		t.Fatalf("duplicate's stderr does not explain:\n%s", dup.Stderr())
	}
	w.quiet(t)

	// The original holds the ID: in the registry, in the gateway's live
	// set, and through its next refresh.
	before, err := w.reg.GetEntry(testCtx(t), "orders", id)
	if err != nil || before.Incarnation != on.Incarnation || before.Zone != "" {
		t.Fatalf("registry after the duplicate: %+v, %v", before, err)
	}
	testutil.Eventually(t, "the gateway to hold the original", func() bool { return slices.Contains(sub.Live()["orders"], id) })
	lease, err := w.reg.LeaseRevision(testCtx(t), "orders", id)
	if err != nil {
		t.Fatalf("the original's lease: %v", err)
	}
	testutil.Eventually(t, "the original's next lease renewal", func() bool {
		rev, err := w.reg.LeaseRevision(testCtx(t), "orders", id)
		return err == nil && rev > lease
	})
	if e, err := w.reg.GetEntry(testCtx(t), "orders", id); err != nil || e.Revision != before.Revision {
		t.Fatalf("the record after a renewal: %+v, %v; want it unwritten", e, err)
	}
	if !slices.Contains(sub.Live()["orders"], id) {
		t.Fatal("the original left the gateway's live set")
	}

	orig.Signal(t, syscall.SIGTERM)
	expectKind(t, w.next(t), events.Offline, id)
	if code := orig.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("original: exit status %d", code)
	}
}

// TestReplaceTakesOverAndTheOriginalYields: -replace takes a live ID over;
// the original sees its record superseded at its next refresh and exits 1
// without withdrawing; the replacement keeps the ID.
func TestReplaceTakesOverAndTheOriginalYields(t *testing.T) {
	t.Parallel()
	w := newWorldTTL(t, natstest.Start(t), 3*time.Second)
	addr := testutil.FreeAddr(t)
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	start(t, backendBin, "-addr", addr).WaitFor(t, "listening on", lineTimeout)
	orig := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr)
	expectKind(t, w.next(t), events.Online, id)

	repl := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-zone", "z2", "-weight", "50", "-replace")
	on := w.next(t)
	expectKind(t, on, events.Online, id)
	if code := orig.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("original: exit status %d, want 1; stderr:\n%s", code, orig.Stderr())
	}
	if !strings.Contains(orig.Stderr(), "replaced by a newer process") {
		t.Fatalf("original's stderr does not say it was replaced:\n%s", orig.Stderr())
	}
	w.quiet(t) // the original published no offline
	in, ok := w.get(t, "orders", id)
	if !ok || in.Zone != "z2" || in.Weight != 50 || in.Incarnation != on.Incarnation {
		t.Fatalf("registry %+v (present %v), want the replacement's", in, ok)
	}
	repl.Signal(t, syscall.SIGTERM)
	expectKind(t, w.next(t), events.Offline, id)
	if code := repl.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("replacement: exit status %d", code)
	}
	if _, ok := w.get(t, "orders", id); ok {
		t.Fatal("still registered after the replacement stopped")
	}
}

// TestLeaseIsTheBuckets: announce never changes the bucket; a -lease that
// disagrees with its TTL is reported and the bucket's is used.
func TestLeaseIsTheBuckets(t *testing.T) {
	t.Parallel()
	w := newWorldTTL(t, natstest.Start(t), 3*time.Second)
	addr := testutil.FreeAddr(t)
	start(t, backendBin, "-addr", addr).WaitFor(t, "listening on", lineTimeout)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-lease", "10s")
	w.next(t)
	if !strings.Contains(a.Stderr(), "disagrees with the registry bucket's TTL") {
		t.Fatalf("no warning about the disagreeing lease:\n%s", a.Stderr())
	}
	st, err := w.reg.KeyValue().Status(testCtx(t))
	if err != nil || st.TTL() != 3*time.Second {
		t.Fatalf("bucket TTL %v (%v), want 3s unchanged", st.TTL(), err)
	}
	a.Signal(t, syscall.SIGTERM)
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
}
