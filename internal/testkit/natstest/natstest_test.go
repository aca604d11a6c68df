package natstest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartConnectPublish(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	sub, err := nc.SubscribeSync("hello")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("hello", []byte("world")); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "world" {
		t.Fatalf("got %q", msg.Data)
	}
	if _, err := os.Stat(srv.StoreDir()); err != nil {
		t.Fatalf("store dir: %v", err)
	}
}

func TestRestartKeepsPortAndData(t *testing.T) {
	srv := natstest.Start(t)
	url := srv.URL()
	reconnected := make(chan struct{}, 1)
	nc := srv.Connect(t, nats.ReconnectHandler(func(*nats.Conn) {
		select {
		case reconnected <- struct{}{}:
		default:
		}
	}))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "natstest"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}

	srv.Restart(t)
	if srv.URL() != url {
		t.Fatalf("URL changed across restart: %s -> %s", url, srv.URL())
	}
	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatal("client did not reconnect")
	}
	// JetStream may need a moment after the reconnect; poll, bounded by ctx.
	for {
		e, err := kv.Get(ctx, "k")
		if err == nil {
			if string(e.Value()) != "v" {
				t.Fatalf("value after restart: %q", e.Value())
			}
			return
		}
		if errors.Is(err, jetstream.ErrKeyNotFound) || ctx.Err() != nil {
			t.Fatalf("get after restart: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestShutdownIsIdempotent(t *testing.T) {
	srv := natstest.Start(t)
	srv.Shutdown()
	srv.Shutdown()
	if srv.NATS() != nil {
		t.Fatal("NATS() after Shutdown should be nil")
	}
}

// A configuration file sets the accounts and permissions; the server still
// listens on a random loopback port, and a restart parses the file again.
func TestWithConfigFile(t *testing.T) {
	conf := t.TempDir() + "/server.conf"
	if err := os.WriteFile(conf, []byte(`
listen: 0.0.0.0:4222
jetstream: enabled
authorization {
  users: [
    {user: reader, password: $NATSTEST_PASSWORD, permissions: {publish: {deny: ">"}, subscribe: {allow: "x.>"}}}
  ]
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATSTEST_PASSWORD", "pw")
	srv := natstest.Start(t, natstest.WithConfigFile(t, conf))
	if u := srv.URL(); u == "nats://127.0.0.1:4222" || u[:17] != "nats://127.0.0.1:" {
		t.Fatalf("URL %s, want a random loopback port", u)
	}
	if _, err := nats.Connect(srv.URL()); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connection: %v, want an authorization error", err)
	}
	refused := make(chan error, 1)
	reconnected := make(chan struct{}, 1)
	nc := srv.Connect(t, nats.UserInfo("reader", "pw"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if !errors.Is(err, nats.ErrPermissionViolation) {
			return // not the answer waited for
		}
		select {
		case refused <- err:
		default:
		}
	}), nats.ReconnectHandler(func(*nats.Conn) {
		select {
		case reconnected <- struct{}{}:
		default:
		}
	}))
	srv.Restart(t)
	// Publish on the restarted server, once the client is back: a publish
	// buffered while it reconnects may be sent or not.
	testutil.Receive(t, reconnected, 20*time.Second, "the client to reconnect to the restarted server")
	if err := nc.Publish("x.y", nil); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	testutil.Receive(t, refused, 20*time.Second, "the restarted server to refuse the publish")
	if srv.NATS().JetStreamEnabled() != true {
		t.Fatal("the file enables JetStream")
	}
}
