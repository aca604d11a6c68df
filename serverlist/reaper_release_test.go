package serverlist_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// TestReaperRelease: the leading reaper frees the ID of a holder whose
// connection closed (the caller's proof) only while the record still
// names that connection and its lease was not renewed since the close;
// a new claim then succeeds at once, where it would otherwise watch the
// record for half the TTL (an hour here). A reaper that does not lead
// does nothing.
func TestReaperRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: 2 * time.Hour})
	closed := serverlist.Connection{ServerID: "NSERVER", ClientID: 7}
	held := inst("orders", "a", 8080)
	held.NATSServerID, held.NATSClientID = closed.ServerID, closed.ClientID
	claimed := claim(t, e.reg, held, "old-owner")
	ctx := testCtx(t, 20*time.Second)

	follower := serverlist.NewReaper(e.reg, serverlist.ReaperConfig{Node: "follower"}) // never started
	if out, err := follower.Release(ctx, "orders", "a", closed, time.Now()); out != serverlist.ReleaseNotLeader || err != nil {
		t.Fatalf("a reaper that does not lead: %v, %v; want not_leader", out, err)
	}
	r := startReaper(t, e.reg, serverlist.ReaperConfig{Node: "leader"})
	testutil.Eventually(t, "the reaper to lead", r.Leader)

	other := closed
	other.ClientID = 8
	if out, err := r.Release(ctx, "orders", "a", other, time.Now()); out != serverlist.ReleaseRenamed || err != nil {
		t.Fatalf("a record naming another connection: %v, %v; want renamed", out, err)
	}
	// The lease was written after the close (its holder lives on another
	// connection, whose record it has not rewritten yet).
	before := time.Now().Add(-time.Minute)
	if out, err := r.Release(ctx, "orders", "a", closed, before); out != serverlist.ReleaseRenewed || err != nil {
		t.Fatalf("a lease renewed after the close: %v, %v; want renewed", out, err)
	}
	if _, err := e.reg.GetEntry(ctx, "orders", "a"); err != nil {
		t.Fatalf("a refused release removed the record: %v", err)
	}

	if _, err := e.reg.RefreshLease(ctx, "orders", "a", "old-owner", claimed.Lease); err != nil {
		t.Fatal(err)
	}
	if out, err := r.Release(ctx, "orders", "a", closed, time.Now().Add(time.Second)); out != serverlist.Released || err != nil {
		t.Fatalf("a holder gone: %v, %v; want released", out, err)
	}
	if _, err := e.reg.GetEntry(ctx, "orders", "a"); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("the record after its release: %v, want not found", err)
	}
	if _, err := e.reg.LeaseRevision(ctx, "orders", "a"); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("the lease after its release: %v, want not found", err)
	}
	restarted := inst("orders", "a", 8080)
	restarted.Owner, restarted.Incarnation = "new-owner", 2
	if _, err := e.reg.Claim(ctx, restarted, serverlist.ClaimOptions{OnProbe: func(serverlist.Instance, time.Duration) {
		t.Error("the new claim watched a released ID")
	}}); err != nil {
		t.Fatalf("the claim of a released ID: %v", err)
	}
	if out, err := r.Release(ctx, "orders", "a", closed, time.Now()); out != serverlist.ReleaseRenamed || err != nil {
		t.Fatalf("the new holder's record, after a late proof about the old one: %v, %v; want renamed", out, err)
	}
}
