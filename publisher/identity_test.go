package publisher_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

func newPublisher(t *testing.T, r *rig, cfg publisher.Config) *publisher.Publisher {
	t.Helper()
	p, err := publisher.New(r.nc, r.reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// holderOf reads the record of orders' instance: its owner and port, or
// "" when it is absent or cannot be read (NATS restarting).
func (r *rig) holderOf(t *testing.T) (owner string, port int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	in, err := r.reg.Get(ctx, orders.Service, orders.InstanceID)
	if err != nil {
		return "", 0
	}
	return in.Owner, in.Port
}

// TestDuplicateIsRefused: a second publisher for an ID a live one holds is
// refused with ErrInUse, writes nothing, and its Withdraw removes nothing.
func TestDuplicateIsRefused(t *testing.T) {
	r := newRig(t, 3*time.Second)
	orig := newPublisher(t, r, publisher.Config{})
	if err := orig.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	r.next(t)
	dup := newPublisher(t, r, publisher.Config{})
	in := orders
	in.Port = 9999
	err := dup.Announce(t.Context(), in)
	if !errors.Is(err, serverlist.ErrInUse) {
		t.Fatalf("duplicate Announce = %v, want ErrInUse", err)
	}
	t.Logf("refused: %v", err)
	if err := dup.Withdraw(t.Context(), "shutdown"); !errors.Is(err, publisher.ErrNotAnnounced) {
		t.Fatalf("the refused publisher's Withdraw = %v", err)
	}
	if owner, port := r.holderOf(t); owner != orig.Owner() || port != orders.Port {
		t.Fatalf("record held by %q port %d, want the original's", owner, port)
	}
	select {
	case e := <-r.evs:
		t.Fatalf("the refused publisher published %+v", e)
	default:
	}
}

// TestReassertsItsRecord: a live publisher whose record is removed (a
// forged purge, an expiry) or overwritten by an older or forged
// registration puts its own back at its next refresh.
func TestReassertsItsRecord(t *testing.T) {
	r := newRig(t, 3*time.Second)
	p := newPublisher(t, r, publisher.Config{LeaseInterval: 200 * time.Millisecond})
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	if err := r.reg.Deregister(t.Context(), orders.Service, orders.InstanceID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the removed record to be re-asserted", func() bool { owner, _ := r.holderOf(t); return owner == p.Owner() })

	forged := p.Instance()
	forged.Owner, forged.Port, forged.Incarnation = "attacker", 6666, forged.Incarnation-1
	if _, err := r.reg.Register(t.Context(), forged); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the overwritten record to be re-asserted", func() bool {
		owner, port := r.holderOf(t)
		return owner == p.Owner() && port == orders.Port
	})
	// A forged record claiming a far-future incarnation does not make it
	// yield either.
	forged.Incarnation = time.Now().Add(24 * time.Hour).UnixNano()
	if _, err := r.reg.Register(t.Context(), forged); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the record to be re-asserted over a future incarnation", func() bool { owner, _ := r.holderOf(t); return owner == p.Owner() })
	select {
	case <-p.Replaced():
		t.Fatal("yielded to a forged record")
	default:
	}
}

// TestReplaceMakesTheOriginalYield: with Replace, a newer process takes the
// ID over at once; the original sees it at its next refresh, yields (no
// fight), and its Withdraw leaves the newer record alone.
func TestReplaceMakesTheOriginalYield(t *testing.T) {
	r := newRig(t, 3*time.Second)
	orig := newPublisher(t, r, publisher.Config{LeaseInterval: 200 * time.Millisecond})
	if err := orig.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	repl := newPublisher(t, r, publisher.Config{Replace: true})
	in := orders
	in.Port = 7070
	if err := repl.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	testutil.Receive(t, orig.Replaced(), 5*time.Second, "the original to yield")
	by, ok := orig.ReplacedBy()
	if !ok || by.Owner != repl.Owner() {
		t.Fatalf("ReplacedBy = %+v, %v", by, ok)
	}
	if err := orig.Withdraw(t.Context(), "shutdown"); !errors.Is(err, publisher.ErrReplaced) {
		t.Fatalf("the replaced publisher's Withdraw = %v, want ErrReplaced", err)
	}
	if owner, port := r.holderOf(t); owner != repl.Owner() || port != 7070 {
		t.Fatalf("record held by %q port %d, want the replacement's", owner, port)
	}
}

// TestReregistersAfterTheBucketIsLost: NATS comes back without its store;
// the publisher recreates the bucket (it may) and re-registers.
func TestReregistersAfterTheBucketIsLost(t *testing.T) {
	r := newRig(t, 3*time.Second)
	p := newPublisher(t, r, publisher.Config{})
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	r.next(t)
	began := time.Now()
	r.srv.RestartWithoutStore(t)
	testutil.Eventually(t, "the record in the new bucket", func() bool { owner, _ := r.holderOf(t); return owner == p.Owner() })
	t.Logf("re-registered %v after the restart without store", time.Since(began))
}

// TestRestartAfterCrashTellsItsWait: a restart that finds its crashed
// predecessor's record (its lease not run out yet) says that it waits, and
// for how long at most, then takes the ID over.
func TestRestartAfterCrashTellsItsWait(t *testing.T) {
	r := newRig(t, 30*time.Second)
	crashed := newPublisher(t, r, publisher.Config{})
	if err := crashed.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	r.next(t)
	crashed.Close() // no withdrawal: the record and its lease stay
	type wait struct {
		held serverlist.Instance
		d    time.Duration
	}
	waits := make(chan wait, 1)
	restart := newPublisher(t, r, publisher.Config{ClaimProbe: 300 * time.Millisecond, OnClaimWait: func(held serverlist.Instance, d time.Duration) {
		waits <- wait{held, d}
	}})
	in := orders
	in.Incarnation = time.Now().UnixNano()
	if err := restart.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	w := testutil.Receive(t, waits, time.Second, "the wait to be told")
	if w.held.Owner != crashed.Owner() || w.d != 300*time.Millisecond {
		t.Fatalf("told a wait on %q for %v, want the crashed owner %q for 300ms", w.held.Owner, w.d, crashed.Owner())
	}
	if owner, _ := r.holderOf(t); owner != restart.Owner() {
		t.Fatalf("record held by %q after the wait, want the restart's", owner)
	}
}
