package serverlist_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// claim claims in for owner and returns what Claim wrote.
func claim(t testing.TB, reg *serverlist.Registry, in serverlist.Instance, owner string) serverlist.Claimed {
	t.Helper()
	in.Owner = owner
	c, err := reg.Claim(testCtx(t, 5*time.Second), in, serverlist.ClaimOptions{})
	if err != nil {
		t.Fatalf("claim %s: %v", in.InstanceID, err)
	}
	return c
}

// renewing renews a lease every interval until stopped, as a live
// publisher does.
func renewing(t *testing.T, reg *serverlist.Registry, in serverlist.Instance, owner string, rev uint64, every time.Duration) (stop func()) {
	return repeat(every, func(ctx context.Context) bool {
		next, err := reg.RefreshLease(ctx, in.Service, in.InstanceID, owner, rev)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("refresh the lease of %s: %v", in.InstanceID, err)
			}
			return false
		}
		rev = next
		return true
	})
}

func startReaper(t *testing.T, reg *serverlist.Registry, cfg serverlist.ReaperConfig) *serverlist.Reaper {
	t.Helper()
	r := serverlist.NewReaper(reg, cfg)
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestReaperRemovesRecordWhenLeaseEnds: a claimed record never ages out by
// itself; when its lease runs out the leading reaper removes it, and a
// gateway's mirror sees the removal, while a record whose lease is renewed
// stays. The mirror receives none of the renewals.
func TestReaperRemovesRecordWhenLeaseEnds(t *testing.T) {
	t.Parallel()
	// A 3 s lease renewed every 200 ms: the renewals keep a margin of 15
	// under a loaded machine's scheduling delays.
	e := newEnv(t, serverlist.RegistryConfig{TTL: 3 * time.Second})
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	r := startReaper(t, e.reg, serverlist.ReaperConfig{Node: "r1"})
	testutil.Eventually(t, "the reaper to lead", r.Leader)

	dead, live := inst("orders", "dead", 1), inst("orders", "live", 2)
	claim(t, e.reg, dead, "o-dead")
	c := claim(t, e.reg, live, "o-live")
	stop := renewing(t, e.reg, live, "o-live", c.Lease, 200*time.Millisecond)
	defer stop()

	began := time.Now()
	testutil.EventuallyWithin(t, 20*time.Second, "the dead instance's record removed", func() bool {
		_, ok := m.Get("orders", "dead")
		return !ok && m.Stats().Removals == 1
	})
	t.Logf("record removed %v after its lease began (TTL 3s)", time.Since(began).Round(time.Millisecond))
	// Both leases began together: the renewed one would have run out too.
	if _, ok := m.Get("orders", "live"); !ok {
		t.Fatal("the record of a renewed lease was removed")
	}
	// The reaper counts a removal once its purge returned, which may be
	// after the mirror saw it.
	testutil.Eventually(t, "the reaper to count the removal", func() bool { return r.Stats().Reaped == 1 })
	if st := r.Stats(); st.Reaped != 1 || st.LeasesEnded != 1 {
		t.Fatalf("reaper stats %+v, want 1 lease ended and 1 record reaped", st)
	}
	// The mirror saw the two records and the removal, not one renewal.
	if st := m.Stats(); st.Puts != 2 || st.Refreshes != 0 {
		t.Fatalf("mirror stats %+v: lease renewals reached it", st)
	}
}

// TestReaperElection: of two reapers one leads; when it closes, the other
// takes the lead at once (the lock is given up, not left to age out).
func TestReaperElection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: 30 * time.Second})
	a := startReaper(t, e.reg, serverlist.ReaperConfig{Node: "a"})
	testutil.Eventually(t, "a to lead", a.Leader)
	b := startReaper(t, e.reg, serverlist.ReaperConfig{Node: "b"})
	// b has seen the lock held once its election watch is up; the lock's
	// value names the leader.
	ctx := testCtx(t, 20*time.Second)
	ent, err := e.reg.KeyValue().Get(ctx, serverlist.ReaperLockKey)
	if err != nil || string(ent.Value()) != "a" {
		t.Fatalf("lock = %v, %v; want held by a", ent, err)
	}
	w, err := e.reg.KeyValue().Watch(ctx, serverlist.ReaperLockKey, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	a.Close()
	// The lock's next change after a's renewals is a's purge: given up,
	// not left to age out (a TTL of 30 s, beyond the waits here).
	for {
		ent := testutil.Receive(t, w.Updates(), 10*time.Second, "the lock's next change")
		if ent == nil {
			t.Fatal("the lock's watch ended")
		}
		if ent.Operation() == jetstream.KeyValuePut && string(ent.Value()) == "a" {
			continue // a renewal that came before the close
		}
		if ent.Operation() != jetstream.KeyValuePurge {
			t.Fatalf("after a closed, the lock's change is %v %q; want a's purge", ent.Operation(), ent.Value())
		}
		break
	}
	testutil.Eventually(t, "b to lead", b.Leader)
	if a.Leader() || b.Stats().Terms != 1 {
		t.Fatalf("a leads %v, b's terms %d", a.Leader(), b.Stats().Terms)
	}
}

// TestReaperSweepsRecordsWithoutLease: a record without a lease, and with
// no marker of its end left (it ended long before, while no reaper led), is
// removed by the sweeps of the next leader: found at the first, removed at
// the second, one TTL later.
func TestReaperSweepsRecordsWithoutLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: time.Second})
	ctx := testCtx(t, 10*time.Second)
	orphan := inst("orders", "orphan", 1)
	claim(t, e.reg, orphan, "o")
	bucket := e.reg.Config().Bucket
	st, err := e.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	lease, _ := serverlist.LeaseKey("orders", "orphan")
	if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+lease)); err != nil {
		t.Fatal(err)
	}
	r := startReaper(t, e.reg, serverlist.ReaperConfig{Node: "r"})
	testutil.EventuallyWithin(t, 10*time.Second, "the orphan removed", func() bool { return r.Stats().Reaped == 1 })
	if _, err := e.reg.Get(ctx, "orders", "orphan"); err == nil {
		t.Fatal("the orphan's record is still there")
	}
	if st := r.Stats(); st.Sweeps < 2 {
		t.Fatalf("removed after %d sweeps, want the second", st.Sweeps)
	}
}

// TestReaperWithoutPermissionWatchesForALeader: a reaper whose user may
// not write the lock stays out of the election, and reports (and logs)
// when no reaper has led for a lease, until one does.
func TestReaperWithoutPermissionWatchesForALeader(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(`
jetstream: {}
accounts: {
  A: {
    jetstream: enabled
    users: [
      {user: rw, password: rw}
      {user: ro, password: ro, permissions: {publish: {deny: ["$KV.pushlb_lb._pushlb.reaper.lock"]}}}
    ]
  }
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t, natstest.WithConfigFile(t, conf))
	open := func(user string) *serverlist.Registry {
		js, err := jetstream.New(srv.Connect(t, nats.UserInfo(user, user)))
		if err != nil {
			t.Fatal(err)
		}
		reg, err := serverlist.Open(testCtx(t, 10*time.Second), js, serverlist.RegistryConfig{TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	rw := open("rw")
	ro := startReaper(t, open("ro"), serverlist.ReaperConfig{Node: "ro"})
	testutil.EventuallyWithin(t, 10*time.Second, "the read-only reaper out of the election", func() bool { return ro.Stats().NotPermitted })
	testutil.EventuallyWithin(t, 10*time.Second, "no leader reported", func() bool { return ro.Stats().Unled })
	if ro.Leader() {
		t.Fatal("a reaper that may not write the lock leads")
	}
	lead := startReaper(t, rw, serverlist.ReaperConfig{Node: "rw"})
	testutil.Eventually(t, "the permitted reaper to lead", lead.Leader)
	testutil.Eventually(t, "the leader seen", func() bool { return !ro.Stats().Unled })
}

// TestReaperSweepsFromTheMirror: a reaper given a synced mirror takes the
// records of its sweeps from the mirror, and lists the leases a batch of
// services at a time: it removes a crashed instance's record whose lease
// ended while no reaper led, and, from the records the mirror leaves out
// of its index, one marked down and one malformed, none with a lease;
// the records of more services than one batch, whose leases are renewed,
// stay.
func TestReaperSweepsFromTheMirror(t *testing.T) {
	t.Parallel()
	// A lease of 5 s renewed every 250 ms: 60 renewing instances stay
	// leased on a loaded machine; the second sweep comes one lease after
	// the first.
	e := newEnv(t, serverlist.RegistryConfig{TTL: 5 * time.Second})
	ctx := testCtx(t, 30*time.Second)
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	if err := m.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	const services = 60 // more than one batch of the lease listing
	var live []serverlist.Instance
	for i := range services {
		in := inst(fmt.Sprintf("svc%02d", i), "live", 8000+i)
		c := claim(t, e.reg, in, "o-live")
		t.Cleanup(renewing(t, e.reg, in, "o-live", c.Lease, 250*time.Millisecond))
		live = append(live, in)
	}
	bucket := e.reg.Config().Bucket
	st, err := e.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	dropLease := func(service, id string) {
		lease, _ := serverlist.LeaseKey(service, id)
		if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+lease)); err != nil {
			t.Fatal(err)
		}
	}
	claim(t, e.reg, inst("orders", "crashed", 1), "o-crashed")
	dropLease("orders", "crashed")
	down := inst("orders", "down", 2)
	down.Status = serverlist.StatusDown
	claim(t, e.reg, down, "o-down")
	dropLease("orders", "down")
	// The malformed record never ages out (Nats-TTL: never), as Claim
	// writes records: a plain put would age out with the bucket's MaxAge,
	// the lease, about when the second sweep comes (one lease after the
	// first), and the reaper would then find no record to remove.
	junk, _ := serverlist.EncodeKey("orders", "junk")
	msg := nats.NewMsg("$KV." + bucket + "." + junk)
	msg.Data = []byte("{not a record")
	msg.Header.Set("Nats-TTL", "never")
	ack, err := e.js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	rev := ack.Sequence
	testutil.Eventually(t, "the mirror to apply the writes", func() bool { return m.Revision() >= rev })
	if _, ok := m.Get("orders", "down"); ok {
		t.Fatal("the mirror indexes a record marked down")
	}

	r := startReaper(t, e.reg, serverlist.ReaperConfig{Node: "r", Mirror: m})
	testutil.EventuallyWithin(t, 20*time.Second, "three records reaped", func() bool { return r.Stats().Reaped >= 3 })
	for _, key := range []string{"crashed", "down", "junk"} {
		k, _ := serverlist.EncodeKey("orders", key)
		if _, err := e.reg.KeyValue().Get(ctx, k); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("record %s: %v, want removed", key, err)
		}
	}
	for _, in := range live {
		if _, err := e.reg.Get(ctx, in.Service, in.InstanceID); err != nil {
			t.Errorf("leased record %s/%s: %v", in.Service, in.InstanceID, err)
		}
	}
	if st := r.Stats(); st.Reaped != 3 || st.MirroredSweeps < 2 || st.MirroredSweeps != st.Sweeps || st.Errors != 0 {
		t.Fatalf("reaper stats %+v: want 3 reaped by sweeps from the mirror, no error", st)
	}
}
