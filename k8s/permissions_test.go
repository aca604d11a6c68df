package pushlbk8s_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbk8s "github.com/pushlb/pushlb/k8s"
	"github.com/pushlb/pushlb/k8s/internal/testenv"
	"github.com/pushlb/pushlb/serverlist"
)

// testNATSPermissions: under the bridge's NATS role of docs/security.md
// (testdata/nats-bridge.conf, beside examples/nats-server's roles), the
// bridge announces the service it is granted, the server refuses it the
// records of a service announce owns, and an announcer may not write the
// bridged service's records.
func testNATSPermissions(t *testing.T, env *testenv.Env) {
	srv := natstest.Start(t, natstest.WithConfigFile(t, "testdata/nats-bridge.conf"))
	connect := func(user string) *nats.Conn { return srv.Connect(t, nats.UserInfo(user, "pw-"+user)) }
	open := func(nc *nats.Conn) *serverlist.Registry {
		t.Helper()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	open(connect("operator")) // creates the bucket, as an operator does

	ann := open(connect("announce-orders"))
	orders := serverlist.Instance{Service: "orders", InstanceID: "10.12.9.9:orders:8080", Host: "10.12.9.9", Port: 8080, Owner: "announce-1", Incarnation: 1}
	if _, err := ann.Register(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	_, err := ann.Register(ctx, serverlist.Instance{Service: "web", InstanceID: "forged", Host: "10.12.9.8", Port: 1, Incarnation: 1})
	cancel()
	if err == nil {
		t.Fatal("an announcer of orders wrote a record of web")
	}

	gw, err := pushlb.New(connect("gateway"), pushlb.Config{Follow: pushlb.FollowListed, Services: []string{"web", "orders"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })

	h := &harness{t: t, env: env, kube: env.Client, ns: "", srv: srv, gw: gw}
	h.ns = newNamespace(t, env)
	h.reg = open(connect("bridge"))
	h.service("web", nil)
	h.service("orders-k8s", map[string]string{pushlbk8s.AnnotationService: "orders"})
	h.putSlice("web-1", "web", readyEP("a", "10.12.0.1", ""))
	h.putSlice("orders-1", "orders-k8s", readyEP("o", "10.12.1.1", ""))
	b := h.startBridgeOn(connect("bridge"), pushlbk8s.Config{})
	h.waitListed("a")
	waitStats(t, b, "the write to orders refused and counted", func(s pushlbk8s.Stats) bool { return s.Errors >= 1 })
	op := open(connect("operator"))
	if e, err := op.GetEntry(t.Context(), "orders", orders.InstanceID); err != nil || e.Owner != orders.Owner {
		t.Fatalf("announce's orders record: %+v, %v", e, err)
	}
	if _, err := op.GetEntry(t.Context(), "orders", h.id("o")); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("the bridge's orders record: %v, want it refused", err)
	}
	ob, err := gw.Balancer("orders")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the gateway lists announce's orders instance alone", func() bool {
		s := ob.Servers()
		return len(s) == 1 && s[0].ID == orders.InstanceID
	})
}
