package serverlist_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// reapCrash claims a crashed instance (never renewed) and a live one
// (renewed every 200 ms) on reg with a running leader r, and checks that
// the crashed one's record goes within the lease plus one sweep interval,
// that the live one stays, and that no renewal reached the reaper (the
// scheduled path: it received the expiry signal alone).
func reapCrash(t *testing.T, reg *serverlist.Registry, r *serverlist.Reaper, sweep time.Duration) {
	t.Helper()
	if !reg.ScheduledLeases() {
		t.Fatal("the registry writes plain leases on a bucket made by Open")
	}
	testutil.Eventually(t, "the reaper to lead", r.Leader)
	dead, live := inst("orders", "dead", 1), inst("orders", "live", 2)
	claim(t, reg, dead, "o-dead")
	c := claim(t, reg, live, "o-live")
	stop := renewing(t, reg, live, "o-live", c.Lease, 200*time.Millisecond)
	defer stop()
	began := time.Now()
	ttl := reg.Config().TTL
	testutil.EventuallyWithin(t, ttl+sweep+10*time.Second, "the crashed instance's record removed", func() bool { return r.Stats().Reaped == 1 })
	t.Logf("record removed %v after its lease began (lease %v)", time.Since(began).Round(time.Millisecond), ttl)
	ctx := testCtx(t, 10*time.Second)
	// A KV read may be served by any replica (direct get), which applies
	// the reaper's deletes a moment after the leader: wait for them.
	testutil.EventuallyWithin(t, 5*time.Second, "the crashed instance's record and lease gone", func() bool {
		_, rerr := reg.Get(ctx, "orders", "dead")
		_, lerr := reg.LeaseRevision(ctx, "orders", "dead")
		return errors.Is(rerr, serverlist.ErrNotFound) && errors.Is(lerr, serverlist.ErrNotFound)
	})
	if _, err := reg.Get(ctx, "orders", "live"); err != nil {
		t.Fatalf("the renewed instance's record: %v", err)
	}
	if st := r.Stats(); st.LeasesEnded < 1 || st.Errors != 0 {
		t.Fatalf("reaper stats %+v, want a lease ended and no error", st)
	}
	if n := r.PlainMessages(); n != 0 {
		t.Fatalf("the reaper received %d lease writes: renewals reached it", n)
	}
}

// TestReaperScheduledSingle: on one server, a crashed instance's record is
// reaped from its lease's expiry signal, and the leader receives none of
// the renewals.
func TestReaperScheduledSingle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: 2 * time.Second})
	r := startReaper(t, e.reg, serverlist.ReaperConfig{Node: "r1", SweepInterval: 5 * time.Second})
	reapCrash(t, e.reg, r, 5*time.Second)
}

// TestReaperScheduledCluster3: the same on a three-node cluster with a
// bucket of three replicas, the publisher and the reaper on different
// nodes' connections.
func TestReaperScheduledCluster3(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	open := func() *serverlist.Registry {
		js, err := jetstream.New(c.Connect(t))
		if err != nil {
			t.Fatal(err)
		}
		reg, err := serverlist.Open(testCtx(t, 30*time.Second), js, serverlist.RegistryConfig{TTL: 2 * time.Second, Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	pub := open()
	r := startReaper(t, open(), serverlist.ReaperConfig{Node: "r1", SweepInterval: 5 * time.Second})
	reapCrash(t, pub, r, 5*time.Second)
}

// TestReaperPlainBucketThenAllowed: a bucket made without message
// schedules (before scheduled leases, or by the operator), with a
// publisher of plain leases on it. The leading reaper leaves the bucket
// alone and reaps from every lease write: the plain publisher's crash is
// reaped as before. Once the operator allows schedules, a publisher that
// opens the bucket writes scheduled leases, and the reaper, at its next
// sweep, consumes their expiry signals.
func TestReaperPlainBucketThenAllowed(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	js := mustJetStream(t, srv.Connect(t))
	ctx := testCtx(t, 60*time.Second)
	bucket := serverlist.BucketName("lb")
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1,
		TTL: 2 * time.Second, LimitMarkerTTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	old, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if old.ScheduledLeases() {
		t.Fatal("a bucket without schedules gives scheduled leases")
	}
	claim(t, old, inst("orders", "plain", 1), "o-plain")
	r := startReaper(t, old, serverlist.ReaperConfig{Node: "r1", SweepInterval: 2 * time.Second})
	testutil.EventuallyWithin(t, 20*time.Second, "the plain lease's record reaped", func() bool { return r.Stats().Reaped == 1 })
	if r.PlainMessages() == 0 {
		t.Fatal("the plain lease was reaped without the plain watch")
	}
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().Config.AllowMsgSchedules {
		t.Fatal("the reaper changed the bucket")
	}

	// The operator allows schedules.
	cfg := st.CachedInfo().Config
	cfg.AllowMsgSchedules, cfg.Discard = true, jetstream.DiscardOld
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	fresh, err := serverlist.Open(ctx, mustJetStream(t, srv.Connect(t)), serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if !fresh.ScheduledLeases() {
		t.Fatal("on a bucket that allows schedules a new publisher writes plain leases")
	}
	claim(t, fresh, inst("orders", "scheduled", 2), "o-new")
	testutil.EventuallyWithin(t, 30*time.Second, "the scheduled lease's record reaped", func() bool { return r.Stats().Reaped == 2 })
	testutil.EventuallyWithin(t, 5*time.Second, "the scheduled lease ended", func() bool {
		_, err := fresh.LeaseRevision(ctx, "orders", "scheduled")
		return errors.Is(err, serverlist.ErrNotFound)
	})
}

// TestOpenPlainLeases: with PlainLeases, Open creates the bucket without
// message schedules and writes plain leases; without, it allows them.
func TestOpenPlainLeases(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	ctx := testCtx(t, 10*time.Second)
	for _, plain := range []bool{true, false} {
		js := mustJetStream(t, srv.Connect(t))
		bucket := "plain_" + map[bool]string{true: "yes", false: "no"}[plain]
		reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Bucket: bucket, PlainLeases: plain})
		if err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		if allowed := st.CachedInfo().Config.AllowMsgSchedules; allowed == plain || reg.ScheduledLeases() == plain {
			t.Errorf("PlainLeases %v: the bucket allows schedules: %v, scheduled leases: %v", plain, allowed, reg.ScheduledLeases())
		}
	}
}

// TestReaperPlainLeasesSaidNotWarned: a leading reaper over a bucket
// without message schedules warns, unless its registry was opened with
// PlainLeases (the gateway with its embedded NATS server, whose first run
// must show no warning): then it says so at info level.
func TestReaperPlainLeasesSaidNotWarned(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	ctx := testCtx(t, 10*time.Second)
	for _, plain := range []bool{true, false} {
		js := mustJetStream(t, srv.Connect(t))
		bucket := "said_" + map[bool]string{true: "plain", false: "made_plain"}[plain]
		// The bucket made plain by an earlier PlainLeases open: the second
		// open, with or without, finds it existing and never changes it.
		if _, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Bucket: bucket, PlainLeases: true}); err != nil {
			t.Fatal(err)
		}
		var logs testutil.SyncBuffer
		reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Bucket: bucket, PlainLeases: plain})
		if err != nil {
			t.Fatal(err)
		}
		r := startReaper(t, reg, serverlist.ReaperConfig{Node: "r-" + bucket, Logger: zerolog.New(&logs)})
		testutil.Eventually(t, "the reaper to say its leases are plain", func() bool {
			return strings.Contains(logs.String(), "leading reaper receives every renewal")
		})
		warned := strings.Contains(logs.String(), `"level":"warn"`)
		said := strings.Contains(logs.String(), "leases are plain, as configured")
		if warned == plain || said != plain {
			t.Errorf("PlainLeases %v: warned %v, said as configured %v; logs:\n%s", plain, warned, said, logs.String())
		}
		r.Close()
	}
}
