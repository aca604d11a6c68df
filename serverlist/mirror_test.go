package serverlist_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// changes records OnChange calls.
type changes struct {
	mu    sync.Mutex
	calls []string
}

func (c *changes) record(service string) {
	c.mu.Lock()
	c.calls = append(c.calls, service)
	c.mu.Unlock()
}

func (c *changes) count(service string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.calls {
		if s == service {
			n++
		}
	}
	return n
}

func TestMirrorInitialSyncAndFollow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 10*time.Second)
	a1 := inst("orders", "10.0.0.1:orders:9001", 9001)
	b1 := inst("billing", "b.1", 7000)
	register(t, e.reg, a1, b1)

	var ch changes
	m := startMirror(t, e.reg, serverlist.MirrorConfig{OnChange: ch.record})

	// The initial sync holds everything and reports each service once.
	if got, ok := m.Get("orders", a1.InstanceID); !ok || !got.Equal(a1) {
		t.Fatalf("Get after sync = %+v, %v", got, ok)
	}
	if !slices.Equal(m.Services(), []string{"billing", "orders"}) {
		t.Fatalf("Services() = %v", m.Services())
	}
	testutil.Eventually(t, "initial OnChange", func() bool { return ch.count("orders") == 1 && ch.count("billing") == 1 })

	// A put shows up, with its OnChange, once its revision is applied.
	a2 := inst("orders", "10.0.0.2:orders:9001", 9001)
	waitApplied(t, m, register(t, e.reg, a2))
	if got := instanceIDs(m.Service("orders")); !slices.Equal(got, []string{a1.InstanceID, a2.InstanceID}) {
		t.Fatalf("Service(orders) = %v", got)
	}
	if n := ch.count("orders"); n != 2 {
		t.Fatalf("orders changed %d times after a2, want 2", n)
	}

	// A refresh with identical data is not a change; an update is.
	waitApplied(t, m, register(t, e.reg, a2))
	if n := ch.count("orders"); n != 2 {
		t.Fatalf("an identical refresh was reported as a change (%d calls)", n)
	}
	a2.Zone = "b"
	waitApplied(t, m, register(t, e.reg, a2))
	if got, _ := m.Get("orders", a2.InstanceID); got.Zone != "b" {
		t.Fatalf("zone update not applied: %+v", got)
	}
	if n := ch.count("orders"); n != 3 {
		t.Fatalf("orders changed %d times after the update, want 3", n)
	}

	// A deregistration removes it; an empty service disappears.
	if err := e.reg.Deregister(ctx, "billing", b1.InstanceID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b1 gone", func() bool { _, ok := m.Get("billing", b1.InstanceID); return !ok })
	if len(m.Service("billing")) != 0 || slices.Contains(m.Services(), "billing") {
		t.Fatalf("billing still listed: %v", m.Services())
	}
	testutil.Eventually(t, "OnChange for removal", func() bool { return ch.count("billing") == 2 })
	if n := ch.count("orders"); n != 3 {
		t.Fatalf("orders changed %d times, want 3 (identical refresh is no change)", n)
	}

	// Copies: mutating a returned instance does not touch the mirror.
	got, _ := m.Get("orders", a1.InstanceID)
	got.Metadata["version"] = "mutated"
	if again, _ := m.Get("orders", a1.InstanceID); again.Metadata["version"] != "1" {
		t.Fatal("Get returned shared metadata")
	}
	st := m.Stats()
	if st.Instances != 2 || st.Syncs != 1 || st.Removals < 1 || st.Puts < 4 { // a superseded put may be skipped
		t.Fatalf("Stats = %+v", st)
	}
}

func TestMirrorLeaseExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: time.Second})
	var ch changes
	m := startMirror(t, e.reg, serverlist.MirrorConfig{OnChange: ch.record})
	in := inst("orders", "crashes", 1)
	start := time.Now()
	register(t, e.reg, in)
	testutil.Eventually(t, "instance in mirror", func() bool { _, ok := m.Get("orders", in.InstanceID); return ok })
	testutil.Eventually(t, "lease expiry", func() bool { _, ok := m.Get("orders", in.InstanceID); return !ok })
	t.Logf("mirror dropped the instance %v after registering it with a 1s lease", time.Since(start))
	testutil.Eventually(t, "OnChange on expiry", func() bool { return ch.count("orders") == 2 })
}

func TestMirrorSkipsMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 10*time.Second)
	kv := e.reg.KeyValue()
	good := inst("orders", "good", 1)
	register(t, e.reg, good)
	badKey, _ := serverlist.EncodeKey("orders", "bad")
	if _, err := kv.PutString(ctx, badKey, "{oops"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "orders.!!", "{}"); err == nil {
		t.Log("server accepted an invalid key") // the client normally refuses it
	}
	if _, err := kv.PutString(ctx, "orders.not-base64-$", "{}"); err == nil {
		t.Log("server accepted an invalid key")
	}
	if _, err := kv.PutString(ctx, "orders.YQ==", "{}"); err != nil { // padded: not a key EncodeKey makes
		t.Fatal(err)
	}
	// Keys of another shape (a lease, the reaper's lock) never reach the
	// mirror: its watch asks for record keys only.
	if _, err := kv.PutString(ctx, "no_dot_here", "{}"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "orders.YQ.lease", "owner"); err != nil {
		t.Fatal(err)
	}

	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	st := m.Stats()
	if st.Instances != 1 || st.MalformedKeys != 1 || st.MalformedValues != 1 {
		t.Fatalf("after sync: %+v", st)
	}

	// A malformed update keeps the last good value.
	goodKey, _ := serverlist.EncodeKey("orders", "good")
	if _, err := kv.PutString(ctx, goodKey, `{"service":"orders","instanceId":"good","host":"","port":1}`); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "x.YQ", "null"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "malformed counted", func() bool { return m.Stats().MalformedValues == 3 })
	if got, ok := m.Get("orders", "good"); !ok || !got.Equal(good) {
		t.Fatalf("last good value lost: %+v, %v", got, ok)
	}
}

func TestMirrorSurvivesServerRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 20*time.Second)
	a1 := inst("orders", "a1", 1)
	a2 := inst("orders", "a2", 2)
	register(t, e.reg, a1, a2)
	var ch changes
	m := startMirror(t, e.reg, serverlist.MirrorConfig{OnChange: ch.record, RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})

	e.srv.Shutdown()
	// While the server is away the mirror serves its last state.
	testutil.Eventually(t, "the mirror's connection to see the server go", func() bool { return !e.js.Conn().IsConnected() })
	if len(m.Service("orders")) != 2 {
		t.Fatalf("mirror lost its state while disconnected: %v", instanceIDs(m.Service("orders")))
	}
	e.srv.Restart(t)

	// Changes after the restart reach the mirror: an update, a removal, a new
	// instance. Retry the writes until JetStream answers again.
	a3 := inst("orders", "a3", 3)
	retry(t, ctx, func(ctx context.Context) error { _, err := e.reg.Register(ctx, a3); return err })
	retry(t, ctx, func(ctx context.Context) error { return e.reg.Deregister(ctx, "orders", a1.InstanceID) })
	testutil.Eventually(t, "changes after restart", func() bool {
		return slices.Equal(instanceIDs(m.Service("orders")), []string{"a2", "a3"})
	})
	if m.Stats().Syncs < 2 {
		t.Fatalf("expected a resync after reconnect: %+v", m.Stats())
	}
	// A later change still flows through the new watch.
	if err := e.reg.Deregister(ctx, "orders", "a2"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a2 removal", func() bool { _, ok := m.Get("orders", "a2"); return !ok })
	t.Logf("stats after restart: %+v", m.Stats())
}

// TestMirrorCatchesUpOnChangesWhileDown deletes an instance while the mirror's
// connection is down: the resync must notice the removal although the mirror
// never saw an event for it.
func TestMirrorCatchesUpOnChangesWhileDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 20*time.Second)
	register(t, e.reg, inst("orders", "a1", 1), inst("orders", "a2", 2))

	// The mirror has a connection of its own that reconnects slowly, so the
	// change below lands while it is away.
	nc := e.srv.Connect(t, nats.ReconnectWait(300*time.Millisecond))
	js := mustJetStream(t, nc)
	mreg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var ch changes
	m := startMirror(t, mreg, serverlist.MirrorConfig{OnChange: ch.record, RetryBackoff: 10 * time.Millisecond})
	testutil.Eventually(t, "initial OnChange", func() bool { return ch.count("orders") == 1 })

	// Restart the server and deregister a1 before the mirror's connection is
	// back: its old watch died with the server, so it learns of the removal
	// by resyncing.
	e.srv.Restart(t)
	retry(t, ctx, func(ctx context.Context) error { return e.reg.Deregister(ctx, "orders", "a1") })
	testutil.Eventually(t, "a1 removed by resync", func() bool { _, ok := m.Get("orders", "a1"); return !ok })
	if _, ok := m.Get("orders", "a2"); !ok {
		t.Fatal("a2 lost")
	}
	if m.Stats().Syncs < 2 {
		t.Fatalf("want a resync: %+v", m.Stats())
	}
	testutil.Eventually(t, "OnChange after resync", func() bool { return ch.count("orders") == 2 })
}

func TestMirrorLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})

	// Close before Start, twice; Start after Close fails; WaitSynced says
	// closed.
	m := serverlist.NewMirror(e.reg, serverlist.MirrorConfig{})
	for range 2 {
		if err := m.Close(); err != nil {
			t.Fatalf("Close before Start = %v", err)
		}
	}
	if err := m.Start(context.Background()); !errors.Is(err, serverlist.ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
	if err := m.WaitSynced(testCtx(t, time.Second)); !errors.Is(err, serverlist.ErrClosed) {
		t.Fatalf("WaitSynced after Close = %v, want ErrClosed", err)
	}

	// Start twice fails; Close is idempotent; state survives Close.
	register(t, e.reg, inst("orders", "a1", 1))
	m = startMirror(t, e.reg, serverlist.MirrorConfig{})
	if err := m.Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	for range 2 {
		if err := m.Close(); err != nil {
			t.Fatalf("Close = %v", err)
		}
	}
	if _, ok := m.Get("orders", "a1"); !ok {
		t.Fatal("closed mirror lost its state")
	}
	if err := m.WaitSynced(testCtx(t, time.Second)); err != nil {
		t.Fatalf("WaitSynced on a closed, synced mirror = %v", err)
	}

	// Cancelling Start's context stops the mirror too.
	ctx, cancel := context.WithCancel(context.Background())
	m = serverlist.NewMirror(e.reg, serverlist.MirrorConfig{})
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	m.Close()

	// An unsynced mirror: WaitSynced honours ctx.
	m = serverlist.NewMirror(e.reg, serverlist.MirrorConfig{})
	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelShort()
	if err := m.WaitSynced(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSynced on an unstarted mirror = %v", err)
	}
}

func TestMirrorEmptyBucketSyncs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	if !m.Synced() || len(m.Services()) != 0 {
		t.Fatalf("synced %v, services %v", m.Synced(), m.Services())
	}
}

// retry runs op until it succeeds, each attempt bounded by 250 ms and by
// ctx, the whole by testutil.Eventually: right after a server restart a
// request can be lost while the client reconnects.
func retry(t testing.TB, ctx context.Context, op func(context.Context) error) {
	t.Helper()
	testutil.Eventually(t, "a registry write after the restart", func() bool {
		actx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		defer cancel()
		return op(actx) == nil
	})
}

func TestMirrorCloseAfterConnectionClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	nc := e.srv.Connect(t)
	reg, err := serverlist.Open(testCtx(t, 5*time.Second), mustJetStream(t, nc), serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	register(t, e.reg, inst("orders", "a1", 1))
	m := startMirror(t, reg, serverlist.MirrorConfig{RetryBackoff: time.Millisecond})
	nc.Close()
	done := make(chan struct{})
	go func() { m.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung after the connection closed")
	}
	if _, ok := m.Get("orders", "a1"); !ok {
		t.Fatal("state lost")
	}
}

// refreshes records OnRefresh calls.
type refreshes struct {
	mu   sync.Mutex
	revs map[string]uint64 // instance ID -> last revision reported
	n    int
}

func (r *refreshes) record(service, id string, inc int64, rev uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.revs == nil {
		r.revs = map[string]uint64{}
	}
	r.revs[id] = rev
	r.n++
}

func (r *refreshes) rev(id string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.revs[id]
}

// TestMirrorRefreshIsCheap: a put that leaves the value unchanged (a lease
// refresh) updates the entry's revision and calls OnRefresh, but is no
// change: no OnChange, no new state.
func TestMirrorRefreshIsCheap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	a1 := inst("orders", "a1", 1)
	first := register(t, e.reg, a1)
	var ch changes
	var rf refreshes
	m := startMirror(t, e.reg, serverlist.MirrorConfig{OnChange: ch.record, OnRefresh: rf.record})
	testutil.Eventually(t, "initial OnChange", func() bool { return ch.count("orders") == 1 })
	if got, ok := m.Entry("orders", "a1"); !ok || got.Revision != first {
		t.Fatalf("Entry = %+v, %v; want revision %d", got, ok, first)
	}
	rev := register(t, e.reg, a1) // the refresh
	waitApplied(t, m, rev)
	if got, _ := m.Entry("orders", "a1"); got.Revision != rev || rf.rev("a1") != rev {
		t.Fatalf("after a refresh: entry revision %d, OnRefresh revision %d; want %d", got.Revision, rf.rev("a1"), rev)
	}
	if n := ch.count("orders"); n != 1 {
		t.Fatalf("a refresh called OnChange: %d calls", n)
	}
	if st := m.Stats(); st.Refreshes != 1 {
		t.Fatalf("Refreshes %d, want 1", st.Refreshes)
	}
	if es := m.Entries("orders"); len(es) != 1 || es[0].Revision != rev {
		t.Fatalf("Entries = %+v", es)
	}
}

// TestMirrorRecreatesLostBucket: NATS comes back without its store, so the
// registry bucket is gone. The mirror recreates it (with the TTL in
// effect), resyncs, and follows the new bucket; its revisions keep growing
// although the new bucket's start again at 1.
func TestMirrorRecreatesLostBucket(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: 4 * time.Second})
	ctx := testCtx(t, 20*time.Second)
	before := register(t, e.reg, inst("orders", "a1", 1), inst("orders", "a2", 2))
	m := startMirror(t, e.reg, serverlist.MirrorConfig{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 100 * time.Millisecond})
	waitApplied(t, m, before)

	began := time.Now()
	e.srv.RestartWithoutStore(t)
	testutil.Eventually(t, "the mirror to recreate the bucket", func() bool { return m.Stats().BucketsRecreated == 1 })
	took := time.Since(began)
	st, err := e.reg.KeyValue().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 4*time.Second {
		t.Fatalf("recreated with TTL %v, want the one in effect, 4s", st.TTL())
	}
	// The publishers re-register into the new bucket.
	var rev uint64
	retry(t, ctx, func(ctx context.Context) (err error) {
		rev, err = e.reg.Register(ctx, inst("orders", "a1", 1))
		return err
	})
	if rev > before {
		t.Fatalf("the new bucket's revision %d is not below the old %d: the test proves nothing", rev, before)
	}
	testutil.Eventually(t, "the mirror to follow the new bucket", func() bool {
		return slices.Equal(instanceIDs(m.Service("orders")), []string{"a1"})
	})
	if got, _ := m.Entry("orders", "a1"); got.Revision <= before {
		t.Fatalf("revision %d after the recreation, want above %d", got.Revision, before)
	}
	t.Logf("bucket recreated %v after the restart; stats %+v", took, m.Stats())
}

// TestMirrorRecreatesDeletedBucket: a bucket deleted while NATS stays up is
// found gone by the periodic check and recreated.
func TestMirrorRecreatesDeletedBucket(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: 4 * time.Second})
	ctx := testCtx(t, 20*time.Second)
	m := startMirror(t, e.reg, serverlist.MirrorConfig{BucketCheck: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond})
	if err := e.js.DeleteKeyValue(ctx, e.reg.Config().Bucket); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the mirror to recreate the deleted bucket", func() bool { return m.Stats().BucketsRecreated >= 1 })
	rev := register(t, e.reg, inst("orders", "a1", 1))
	testutil.Eventually(t, "the mirror to follow the new bucket", func() bool { _, ok := m.Get("orders", "a1"); return ok })
	t.Logf("revision %d in the new bucket; stats %+v", rev, m.Stats())
}

// TestMirrorMarkedDownIsAbsent: a record marked down (its health check
// fails) reads as absent, to the mirror at sync and live, and to Get,
// while GetEntry shows it; written serving again, it is back.
func TestMirrorMarkedDownIsAbsent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 10*time.Second)
	a1, a2 := inst("orders", "a.1", 9001), inst("orders", "a.2", 9002)
	down := a2
	down.Status = serverlist.StatusDown
	register(t, e.reg, a1, down)
	var ch changes
	m := startMirror(t, e.reg, serverlist.MirrorConfig{OnChange: ch.record})
	if got := instanceIDs(m.Service("orders")); !slices.Equal(got, []string{"a.1"}) {
		t.Fatalf("after sync: %v, want only a.1 (a.2 is marked down)", got)
	}
	if _, err := e.reg.Get(ctx, "orders", "a.2"); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("Get of a record marked down: %v, want ErrNotFound", err)
	}
	if held, err := e.reg.GetEntry(ctx, "orders", "a.2"); err != nil || held.Status != serverlist.StatusDown {
		t.Fatalf("GetEntry: %+v, %v", held, err)
	}
	waitApplied(t, m, register(t, e.reg, a2))
	if got := instanceIDs(m.Service("orders")); !slices.Equal(got, []string{"a.1", "a.2"}) {
		t.Fatalf("serving again: %v", got)
	}
	waitApplied(t, m, register(t, e.reg, down))
	if got := instanceIDs(m.Service("orders")); !slices.Equal(got, []string{"a.1"}) {
		t.Fatalf("marked down live: %v", got)
	}
	bad := a1
	bad.Status = "sleepy"
	if _, err := e.reg.Register(ctx, bad); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("an unknown status: %v, want ErrInvalidInstance", err)
	}
}
