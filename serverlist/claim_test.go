package serverlist_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// holder keeps a record alive as a live process does: it refreshes it
// until stopped.
func holder(t *testing.T, reg *serverlist.Registry, in serverlist.Instance, every time.Duration) (stop func()) {
	t.Helper()
	return repeat(every, func(ctx context.Context) bool {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		reg.Refresh(rctx, in)
		return true
	})
}

// TestClaim: the identity rule. A free ID is created; the same owner
// re-claims in place; another owner is refused while the holder refreshes,
// takes over once the holder stops refreshing (a crash whose lease has not
// run out), and takes over at once with Replace.
func TestClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: 3 * time.Second})
	ctx := testCtx(t, 10*time.Second)
	orig := inst("orders", "i-1", 8080)
	orig.Owner, orig.Incarnation = "original", 100
	if _, err := e.reg.Claim(ctx, orig, serverlist.ClaimOptions{}); err != nil {
		t.Fatal(err)
	}
	again := orig
	again.Port = 8081
	if _, err := e.reg.Claim(ctx, again, serverlist.ClaimOptions{}); err != nil {
		t.Fatalf("the owner re-claiming: %v", err)
	}

	stop := holder(t, e.reg, again, 100*time.Millisecond)
	dup := inst("orders", "i-1", 9090)
	dup.Owner, dup.Incarnation = "duplicate", 200
	_, err := e.reg.Claim(ctx, dup, serverlist.ClaimOptions{Probe: 2 * time.Second})
	if !errors.Is(err, serverlist.ErrInUse) {
		t.Fatalf("claiming a live holder's ID = %v, want ErrInUse", err)
	}
	if got, err := e.reg.Get(ctx, "orders", "i-1"); err != nil || got.Owner != "original" || got.Port != 8081 {
		t.Fatalf("a refused claim changed the record: %+v, %v", got, err)
	}
	stop()

	// The holder is gone but its record has not expired: after the probe
	// it is presumed dead.
	began := time.Now()
	if _, err := e.reg.Claim(ctx, dup, serverlist.ClaimOptions{Probe: 300 * time.Millisecond}); err != nil {
		t.Fatalf("claiming a dead holder's ID: %v", err)
	}
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Fatalf("took over after %v, before the probe ended", took)
	}
	if got, _ := e.reg.Get(ctx, "orders", "i-1"); got.Owner != "duplicate" {
		t.Fatalf("record %+v, want the new owner", got)
	}

	// Replace takes a live holder's ID at once; the holder then sees it
	// was superseded.
	stop = holder(t, e.reg, dup, 100*time.Millisecond)
	defer stop()
	repl := inst("orders", "i-1", 7070)
	repl.Owner, repl.Incarnation = "replacement", 300
	if _, err := e.reg.Claim(ctx, repl, serverlist.ClaimOptions{Replace: true}); err != nil {
		t.Fatal(err)
	}
	if !serverlist.Superseded(dup, repl, time.Now()) {
		t.Fatal("a newer owner's record must supersede")
	}
	if serverlist.Superseded(repl, dup, time.Now()) {
		t.Fatal("an older owner's record must not supersede")
	}
	forged := repl
	forged.Owner, forged.Incarnation = "forger", time.Now().Add(2*time.Hour).UnixNano()
	if serverlist.Superseded(repl, forged, time.Now()) {
		t.Fatal("a record with a future incarnation must not supersede")
	}
	if _, err := e.reg.Claim(ctx, serverlist.Instance{Service: "orders", InstanceID: "x", Host: "h", Port: 1}, serverlist.ClaimOptions{}); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Claim without an owner = %v", err)
	}
}

// TestClaimAsksTheHolder: ClaimOptions.HolderAnswers. A holder that
// answers refuses the claim at once, though its lease (an hour long) is
// never renewed and the watch would last half an hour; one that does not
// leaves the watch as it was, which presumes it dead at its end; a renewal
// while the hook runs is not missed; Replace asks nothing.
func TestClaimAsksTheHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: time.Hour})
	ctx := testCtx(t, 10*time.Second)
	orig := inst("orders", "i-1", 8080)
	orig.Owner, orig.Incarnation = "original", 100
	claimed, err := e.reg.Claim(ctx, orig, serverlist.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dup := inst("orders", "i-1", 9090)
	dup.Owner, dup.Incarnation = "duplicate", 200
	noWatch := func(serverlist.Instance, time.Duration) { t.Error("the claim watched a holder that answers") }

	var asked []serverlist.Instance
	answers := func(hctx context.Context, held serverlist.Instance) bool {
		if _, ok := hctx.Deadline(); !ok {
			t.Error("HolderAnswers's context has no deadline")
		}
		asked = append(asked, held)
		return true
	}
	_, err = e.reg.Claim(ctx, dup, serverlist.ClaimOptions{HolderAnswers: answers, OnProbe: noWatch})
	if !errors.Is(err, serverlist.ErrInUse) || !strings.Contains(err.Error(), "answers") || !strings.Contains(err.Error(), "127.0.0.1:8080") {
		t.Fatalf("claiming the ID of a holder that answers = %v, want ErrInUse saying so", err)
	}
	if len(asked) != 1 || asked[0].Owner != "original" || asked[0].Addr() != orig.Addr() {
		t.Fatalf("HolderAnswers asked about %+v, want the original's record once", asked)
	}
	if got, err := e.reg.GetEntry(ctx, "orders", "i-1"); err != nil || got.Owner != "original" {
		t.Fatalf("a refused claim changed the record: %+v, %v", got, err)
	}
	if rev, err := e.reg.LeaseRevision(ctx, "orders", "i-1"); err != nil || rev != claimed.Lease {
		t.Fatalf("the lease: revision %d, %v; want %d, never renewed", rev, err, claimed.Lease)
	}

	// The holder renews its lease while the hook runs, and the hook says
	// nothing: the watch, started before it, sees the renewal.
	renewed := func(hctx context.Context, held serverlist.Instance) bool {
		if _, err := e.reg.RefreshLease(hctx, held.Service, held.InstanceID, held.Owner, claimed.Lease); err != nil {
			t.Errorf("renewing the holder's lease: %v", err)
		}
		return false
	}
	if _, err := e.reg.Claim(ctx, dup, serverlist.ClaimOptions{HolderAnswers: renewed}); !errors.Is(err, serverlist.ErrInUse) {
		t.Fatalf("claiming the ID of a holder that renewed during the hook = %v, want ErrInUse", err)
	}

	// Nothing answers: the watch decides as without the hook.
	watched := make(chan time.Duration, 1)
	silent := func(context.Context, serverlist.Instance) bool { return false }
	if _, err := e.reg.Claim(ctx, dup, serverlist.ClaimOptions{Probe: 300 * time.Millisecond, HolderAnswers: silent,
		OnProbe: func(_ serverlist.Instance, d time.Duration) { watched <- d }}); err != nil {
		t.Fatalf("claiming the ID of a holder that does not answer nor renew: %v", err)
	}
	if d := testutil.Receive(t, watched, time.Second, "the watch"); d != 300*time.Millisecond {
		t.Fatalf("watched for %v, want the probe's 300ms", d)
	}
	if got, err := e.reg.GetEntry(ctx, "orders", "i-1"); err != nil || got.Owner != "duplicate" {
		t.Fatalf("record %+v, %v; want the new owner's", got, err)
	}

	repl := inst("orders", "i-1", 7070)
	repl.Owner, repl.Incarnation = "replacement", 300
	never := func(context.Context, serverlist.Instance) bool { t.Error("Replace asked the holder"); return true }
	if _, err := e.reg.Claim(ctx, repl, serverlist.ClaimOptions{Replace: true, HolderAnswers: never}); err != nil {
		t.Fatal(err)
	}
	if w := e.reg.ClaimWait(serverlist.ClaimOptions{}); w != 30*time.Minute {
		t.Fatalf("ClaimWait = %v, want half the TTL", w)
	}
}
