package serverlist_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/serverlist"
)

// streamReplicas returns the replicas of the registry bucket's stream.
func streamReplicas(t testing.TB, js jetstream.JetStream, bucket string) int {
	t.Helper()
	s, err := js.Stream(testCtx(t, 5*time.Second), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config.Replicas
}

// createBucket creates the registry bucket as an operator would, with a 3 s
// lease and the given replicas.
func createBucket(t testing.TB, js jetstream.JetStream, replicas int) {
	t.Helper()
	_, err := js.CreateKeyValue(testCtx(t, 10*time.Second), jetstream.KeyValueConfig{
		Bucket: "pushlb_lb", History: 1, TTL: 3 * time.Second, LimitMarkerTTL: 3 * time.Second, Replicas: replicas,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// On a three-node cluster the bucket is created with three replicas by
// default; an existing one with fewer is left alone by Open, and raised
// (replicas only) by ScaleUp, which never lowers them.
func TestReplicasOnAThreeNodeCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	js := mustJetStream(t, c.Connect(t))
	ctx := testCtx(t, 20*time.Second)

	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Prefix: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := reg.Config().Replicas, 3; got != want || streamReplicas(t, js, "pushlb_auto") != want {
		t.Fatalf("created with R%d (stream R%d), want R%d", got, streamReplicas(t, js, "pushlb_auto"), want)
	}

	createBucket(t, js, 1)
	reg, err = serverlist.Open(ctx, js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if reg.Config().Replicas != 1 || streamReplicas(t, js, "pushlb_lb") != 1 {
		t.Fatalf("Open changed an existing bucket: R%d", streamReplicas(t, js, "pushlb_lb"))
	}
	from, to, err := reg.ScaleUp(ctx)
	if err != nil || from != 1 || to != 3 {
		t.Fatalf("ScaleUp = %d, %d, %v; want 1, 3, nil", from, to, err)
	}
	kv := reg.KeyValue()
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if streamReplicas(t, js, "pushlb_lb") != 3 || st.TTL() != 3*time.Second || st.LimitMarkerTTL() != 3*time.Second {
		t.Fatalf("after ScaleUp: R%d, TTL %v, marker TTL %v; want R3 and the lease unchanged", streamReplicas(t, js, "pushlb_lb"), st.TTL(), st.LimitMarkerTTL())
	}
	if from, to, err := reg.ScaleUp(ctx); err != nil || from != 3 || to != 3 {
		t.Fatalf("second ScaleUp = %d, %d, %v; want nothing to do", from, to, err)
	}
	// A configured count below the bucket's never lowers it.
	two, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	if from, to, err := two.ScaleUp(ctx); err != nil || from != 3 || to != 3 || streamReplicas(t, js, "pushlb_lb") != 3 {
		t.Fatalf("ScaleUp with Replicas 2 over R3 = %d, %d, %v", from, to, err)
	}
}

// On a two-node cluster, three replicas cannot be placed: the automatic
// count falls back to two, for a new bucket and for a scale-up.
func TestReplicasOnATwoNodeCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 2)
	js := mustJetStream(t, c.Connect(t))
	ctx := testCtx(t, 20*time.Second)
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Prefix: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	if got := reg.Config().Replicas; got != 2 || streamReplicas(t, js, "pushlb_auto") != 2 {
		t.Fatalf("created with R%d, want R2", got)
	}
	createBucket(t, js, 1)
	reg, err = serverlist.Open(ctx, js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if from, to, err := reg.ScaleUp(ctx); err != nil || from != 1 || to != 2 {
		t.Fatalf("ScaleUp = %d, %d, %v; want 1, 2, nil", from, to, err)
	}
	// An explicit count the cluster cannot place is an error, not a guess.
	three, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := three.ScaleUp(ctx); err == nil || streamReplicas(t, js, "pushlb_lb") != 2 {
		t.Fatalf("ScaleUp to an unplaceable R3 = %v, stream R%d", err, streamReplicas(t, js, "pushlb_lb"))
	}
}

// A lone server gets one replica without trying more; an explicit count
// above one is refused at once.
func TestReplicasOnALoneServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	if e.reg.Config().Replicas != 1 {
		t.Fatalf("R%d", e.reg.Config().Replicas)
	}
	if from, to, err := e.reg.ScaleUp(testCtx(t, 5*time.Second)); err != nil || from != 1 || to != 1 {
		t.Fatalf("ScaleUp = %d, %d, %v", from, to, err)
	}
	if _, err := serverlist.Open(testCtx(t, 5*time.Second), e.js, serverlist.RegistryConfig{Prefix: "r3", Replicas: 3}); err == nil {
		t.Fatal("Open with Replicas 3 on a lone server succeeded")
	}
}

// A gateway user without $JS.API.STREAM.UPDATE (examples/nats-server)
// cannot scale the bucket up: ScaleUp says so with ErrNotPermitted and the
// bucket is unchanged.
func TestScaleUpNotPermitted(t *testing.T) {
	t.Parallel()
	users := func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "operator", Password: "op"},
			{Username: "gateway", Password: "gw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{
					"$JS.API.STREAM.INFO.KV_pushlb_lb", "$JS.API.DIRECT.GET.KV_pushlb_lb.>",
					"$JS.API.CONSUMER.CREATE.KV_pushlb_lb.>", "$JS.API.CONSUMER.MSG.NEXT.KV_pushlb_lb.>", "$JS.API.CONSUMER.DELETE.KV_pushlb_lb.>", "$JS.FC.KV_pushlb_lb.>",
				}},
				Subscribe: &server.SubjectPermission{Allow: []string{"lb.svc.>", "_INBOX.>"}},
			}},
		}
		o.NoAuthUser = "operator" // the cluster's own checks connect without credentials
	}
	c := natstest.StartCluster(t, 3, users)
	createBucket(t, mustJetStream(t, c.Connect(t, nats.UserInfo("operator", "op"))), 1)
	gwjs := mustJetStream(t, c.Connect(t, nats.UserInfo("gateway", "gw")))
	reg, err := serverlist.Open(testCtx(t, 10*time.Second), gwjs, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	from, to, err := reg.ScaleUp(ctx)
	if !errors.Is(err, serverlist.ErrNotPermitted) || from != 1 || to != 1 {
		t.Fatalf("ScaleUp = %d, %d, %v; want ErrNotPermitted", from, to, err)
	}
	if n := streamReplicas(t, gwjs, "pushlb_lb"); n != 1 {
		t.Fatalf("stream R%d", n)
	}
}
