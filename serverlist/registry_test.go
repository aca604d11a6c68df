package serverlist_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/serverlist"
)

func TestRegistryConfigDefaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	cfg := e.reg.Config()
	if cfg.Bucket != "pushlb_lb" || cfg.Prefix != "lb" || cfg.TTL != serverlist.DefaultTTL || cfg.MarkerTTL != cfg.TTL || cfg.Replicas != 1 {
		t.Fatalf("defaults: %+v", cfg)
	}
	st, err := e.reg.KeyValue().Status(testCtx(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != serverlist.DefaultTTL || st.LimitMarkerTTL() != serverlist.DefaultTTL {
		t.Fatalf("bucket TTL %v, marker TTL %v", st.TTL(), st.LimitMarkerTTL())
	}
}

func TestRegistryConfigInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 5*time.Second)
	for _, cfg := range []serverlist.RegistryConfig{
		{TTL: -time.Second},
		{TTL: 500 * time.Millisecond},
		{MarkerTTL: 10 * time.Millisecond},
		{Replicas: 6},
		{Replicas: -1},
		{Bucket: "has.dot"},
		{Prefix: "a b"},
	} {
		if _, err := serverlist.Open(ctx, e.js, cfg); !errors.Is(err, serverlist.ErrInvalidConfig) {
			t.Errorf("Open(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	// A dotted prefix derives a valid bucket name.
	reg, err := serverlist.Open(ctx, e.js, serverlist.RegistryConfig{Prefix: "acme.lb", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if reg.Config().Bucket != "pushlb_acme_lb" {
		t.Fatalf("bucket %q", reg.Config().Bucket)
	}
}

// TestOpenKeepsTheBucketsTTL: the TTL is the bucket's. A process whose
// configured lease disagrees says so, uses the bucket's, and changes
// nothing; one with no lease configured adopts it silently.
func TestOpenKeepsTheBucketsTTL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: 2 * time.Second})
	ctx := testCtx(t, 5*time.Second)
	var logs bytes.Buffer
	reg, err := serverlist.Open(ctx, e.js, serverlist.RegistryConfig{TTL: 7 * time.Second, Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	if got := reg.Config().TTL; got != 2*time.Second {
		t.Fatalf("TTL in effect %v, want the bucket's 2s", got)
	}
	if !strings.Contains(logs.String(), "disagrees with the registry bucket's TTL") || !strings.Contains(logs.String(), `"configured_lease":7000`) {
		t.Fatalf("no warning that says so: %s", logs.String())
	}
	st, err := e.reg.KeyValue().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 2*time.Second || st.LimitMarkerTTL() != 2*time.Second {
		t.Fatalf("the bucket changed: TTL %v, marker TTL %v", st.TTL(), st.LimitMarkerTTL())
	}
	logs.Reset()
	reg, err = serverlist.Open(ctx, e.js, serverlist.RegistryConfig{Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	if reg.Config().TTL != 2*time.Second || logs.Len() != 0 {
		t.Fatalf("no lease configured: TTL %v, logs %s", reg.Config().TTL, logs.String())
	}
}

// TestConditionalWrites: Create refuses a live key, Update and
// DeregisterRevision refuse a stale revision, DeregisterOwned leaves
// another owner's record alone.
func TestConditionalWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 5*time.Second)
	in := inst("orders", "i-1", 8080)
	in.Owner = "a"
	rev, err := e.reg.Create(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Create(ctx, in); !errors.Is(err, serverlist.ErrExists) {
		t.Fatalf("second Create = %v, want ErrExists", err)
	}
	rev2, err := e.reg.Update(ctx, in, rev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Update(ctx, in, rev); !errors.Is(err, serverlist.ErrRevisionMismatch) {
		t.Fatalf("Update at a stale revision = %v, want ErrRevisionMismatch", err)
	}
	if err := e.reg.DeregisterRevision(ctx, "orders", "i-1", rev); !errors.Is(err, serverlist.ErrRevisionMismatch) {
		t.Fatalf("DeregisterRevision at a stale revision = %v", err)
	}
	got, err := e.reg.GetEntry(ctx, "orders", "i-1")
	if err != nil || got.Revision != rev2 || !got.Instance.Equal(in) {
		t.Fatalf("GetEntry = %+v, %v; want revision %d", got, err, rev2)
	}
	if err := e.reg.DeregisterOwned(ctx, "orders", "i-1", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Get(ctx, "orders", "i-1"); err != nil {
		t.Fatalf("another owner's DeregisterOwned removed the record: %v", err)
	}
	if err := e.reg.DeregisterOwned(ctx, "orders", "i-1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Get(ctx, "orders", "i-1"); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("the owner's DeregisterOwned left the record: %v", err)
	}
	// A removed key can be created again.
	if _, err := e.reg.Create(ctx, in); err != nil {
		t.Fatalf("Create after removal: %v", err)
	}
}

func TestRegistryCRUD(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 10*time.Second)

	a1 := inst("orders", "10.0.0.1:orders:9001", 9001)
	a2 := inst("orders", "10.0.0.2:orders:9001", 9001)
	b1 := inst("billing", "billing/0", 7000)
	b1.Secure = true
	register(t, e.reg, a1, a2, b1)

	got, err := e.reg.Get(ctx, "orders", a1.InstanceID)
	if err != nil || !got.Equal(a1) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	list, err := e.reg.List(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || !list[0].Equal(a1) || !list[1].Equal(a2) {
		t.Fatalf("List(orders) = %+v", list)
	}
	all, err := e.reg.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if ids := instanceIDs(all); !slices.Equal(ids, []string{"billing/0", a1.InstanceID, a2.InstanceID}) {
		t.Fatalf("List(all) = %v", ids)
	}
	if list, err := e.reg.List(ctx, "nobody"); err != nil || len(list) != 0 {
		t.Fatalf("List(nobody) = %v, %v", list, err)
	}

	// Register again with new data: an update, new revision.
	a1.Port = 9002
	rev1, err := e.reg.Refresh(ctx, a1)
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := e.reg.Refresh(ctx, a1)
	if err != nil || rev2 <= rev1 {
		t.Fatalf("refresh revisions %d then %d, %v", rev1, rev2, err)
	}
	if got, _ := e.reg.Get(ctx, "orders", a1.InstanceID); got.Port != 9002 {
		t.Fatalf("after update: %+v", got)
	}

	if err := e.reg.Deregister(ctx, "orders", a1.InstanceID); err != nil {
		t.Fatal(err)
	}
	if err := e.reg.Deregister(ctx, "orders", a1.InstanceID); err != nil {
		t.Fatalf("second Deregister: %v", err)
	}
	if err := e.reg.Deregister(ctx, "orders", "never-registered"); err != nil {
		t.Fatalf("Deregister unknown: %v", err)
	}
	if _, err := e.reg.Get(ctx, "orders", a1.InstanceID); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("Get after Deregister = %v, want ErrNotFound", err)
	}
	if _, err := e.reg.Get(ctx, "orders", "never-registered"); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("Get unknown = %v, want ErrNotFound", err)
	}
	if list, _ := e.reg.List(ctx, "orders"); len(list) != 1 || list[0].InstanceID != a2.InstanceID {
		t.Fatalf("List after Deregister = %+v", list)
	}
	// Re-registering a deregistered instance brings it back.
	register(t, e.reg, a1)
	if _, err := e.reg.Get(ctx, "orders", a1.InstanceID); err != nil {
		t.Fatalf("Get after re-register: %v", err)
	}
}

func TestRegistryRejectsInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 5*time.Second)
	bad := inst("orders", "x", 0)
	if _, err := e.reg.Register(ctx, bad); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Register(port 0) = %v", err)
	}
	if _, err := e.reg.Get(ctx, "or.ders", "x"); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Get(bad service) = %v", err)
	}
	if err := e.reg.Deregister(ctx, "orders", ""); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Deregister(empty id) = %v", err)
	}
	if _, err := e.reg.List(ctx, "a>"); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("List(bad service) = %v", err)
	}
}

func TestRegistryWeirdIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 10*time.Second)
	ids := []string{"h:svc:1", "a.b.c", "x/y/z", "with space", "日本:🚀", "*", ">", "..", "-_="}
	for i, id := range ids {
		register(t, e.reg, inst("weird", id, 1000+i))
	}
	for i, id := range ids {
		got, err := e.reg.Get(ctx, "weird", id)
		if err != nil || got.InstanceID != id || got.Port != 1000+i {
			t.Errorf("Get(%q) = %+v, %v", id, got, err)
		}
	}
	list, err := e.reg.List(ctx, "weird")
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(ids)
	slices.Sort(want)
	if got := instanceIDs(list); !slices.Equal(got, want) {
		t.Fatalf("List = %q, want %q", got, want)
	}
}

func TestRegistryListSkipsMalformed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	ctx := testCtx(t, 5*time.Second)
	register(t, e.reg, inst("orders", "good", 1))
	kv := e.reg.KeyValue()
	badKey, _ := serverlist.EncodeKey("orders", "bad-json")
	otherKey, _ := serverlist.EncodeKey("orders", "mismatch")
	for key, val := range map[string]string{
		badKey:            "{not json",
		otherKey:          `{"service":"orders","instanceId":"someone-else","host":"h","port":1}`,
		"orders.not_b64!": `{}`,
		"orders.=":        `{}`,
	} {
		if _, err := kv.PutString(ctx, key, val); err != nil && !errors.Is(err, jetstream.ErrInvalidKey) {
			t.Fatalf("put %q: %v", key, err)
		}
	}
	list, err := e.reg.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].InstanceID != "good" {
		t.Fatalf("List = %+v", list)
	}
	if e.reg.Malformed() < 3 {
		t.Fatalf("Malformed() = %d, want >= 3", e.reg.Malformed())
	}
	if _, err := e.reg.Get(ctx, "orders", "bad-json"); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Get(bad json) = %v, want ErrInvalidInstance", err)
	}
}

// TestLeaseExpiryReachesWatcher pins down how an expired lease shows up:
// the entry is gone for Get and a KV watcher receives a purge marker
// (Nats-Marker-Reason: MaxAge) with an empty value.
func TestLeaseExpiryReachesWatcher(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: time.Second})
	ctx := testCtx(t, 10*time.Second)
	w, err := e.reg.KeyValue().WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	in := inst("orders", "short-lived", 1)
	start := time.Now()
	register(t, e.reg, in)
	key, _ := serverlist.EncodeKey(in.Service, in.InstanceID)

	var put, gone jetstream.KeyValueEntry
	for gone == nil {
		select {
		case <-ctx.Done():
			t.Fatalf("no expiry marker after %v", time.Since(start))
		case ent := <-w.Updates():
			if ent == nil || ent.Key() != key {
				continue
			}
			if put == nil {
				put = ent
				continue
			}
			gone = ent
		}
	}
	elapsed := time.Since(start)
	if put.Operation() != jetstream.KeyValuePut {
		t.Fatalf("first entry op %v", put.Operation())
	}
	if gone.Operation() != jetstream.KeyValuePurge || len(gone.Value()) != 0 {
		t.Fatalf("expiry entry op %v value %q, want KeyValuePurgeOp and empty", gone.Operation(), gone.Value())
	}
	// Not before the TTL; how long after it, the server's expiry decides
	// (ctx bounds the wait).
	if elapsed < 900*time.Millisecond {
		t.Fatalf("expired after %v, before the TTL of 1s", elapsed)
	}
	t.Logf("lease of 1s expired after %v; watcher saw %v", elapsed, gone.Operation())
	if _, err := e.reg.Get(ctx, in.Service, in.InstanceID); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("Get after expiry = %v, want ErrNotFound", err)
	}
}

func TestRefreshKeepsLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{TTL: time.Second})
	ctx := testCtx(t, 10*time.Second)
	in := inst("orders", "kept", 1)
	registered := time.Now()
	register(t, e.reg, in)
	// A lease loop, as a publisher runs one, for longer than the TTL: the
	// ticker paces the refreshes; nothing is ordered by it.
	refresh := time.NewTicker(250 * time.Millisecond)
	defer refresh.Stop()
	for time.Since(registered) < 1600*time.Millisecond {
		<-refresh.C
		if _, err := e.reg.Refresh(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	// The entry outlived its first put by more than the TTL.
	if _, err := e.reg.Get(ctx, in.Service, in.InstanceID); err != nil {
		t.Fatalf("refreshed instance expired: %v", err)
	}
}

func instanceIDs(list []serverlist.Instance) []string {
	ids := make([]string, len(list))
	for i, in := range list {
		ids[i] = in.InstanceID
	}
	return ids
}
