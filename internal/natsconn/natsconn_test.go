package natsconn_test

import (
	"context"
	"errors"
	"flag"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/natsconn"
	"github.com/pushlb/pushlb/internal/natstest"
	"github.com/pushlb/pushlb/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitFor polls cond every 10 ms until it holds or d has passed.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRegisterFlags(t *testing.T) {
	var c natsconn.Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if c.URL != natsconn.DefaultURL || c.ConnectTimeout != natsconn.DefaultConnectTimeout {
		t.Fatalf("defaults: %+v", c)
	}
	for _, name := range []string{"nats", "creds", "user", "password", "token", "tls-ca", "tls-cert", "tls-key", "nats-timeout"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s not registered", name)
		}
	}
	err := fs.Parse([]string{"-nats", "nats://n1:4222,nats://n2:4222", "-user", "u", "-password", "p",
		"-tls-ca", "ca.pem", "-tls-cert", "c.pem", "-tls-key", "k.pem", "-nats-timeout", "3s", "-creds", "x.creds", "-token", "t"})
	if err != nil {
		t.Fatal(err)
	}
	want := natsconn.Config{URL: "nats://n1:4222,nats://n2:4222", User: "u", Password: "p", TLSCA: "ca.pem",
		TLSCert: "c.pem", TLSKey: "k.pem", ConnectTimeout: 3 * time.Second, CredsFile: "x.creds", Token: "t"}
	if c != want {
		t.Fatalf("parsed %+v, want %+v", c, want)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  natsconn.Config
		want string // substring of the error; "" for valid
	}{
		{"zero", natsconn.Config{}, ""},
		{"user and password", natsconn.Config{User: "u", Password: "p"}, ""},
		{"cert and key", natsconn.Config{TLSCert: "c", TLSKey: "k"}, ""},
		{"user and token", natsconn.Config{User: "u", Token: "t"}, "-user and -token"},
		{"password alone", natsconn.Config{Password: "p"}, "-password needs -user"},
		{"creds and token", natsconn.Config{CredsFile: "f", Token: "t"}, "-creds cannot be combined"},
		{"cert without key", natsconn.Config{TLSCert: "c"}, "-tls-cert and -tls-key"},
		{"key without cert", natsconn.Config{TLSKey: "k"}, "-tls-cert and -tls-key"},
		{"negative timeout", natsconn.Config{ConnectTimeout: -time.Second}, "-nats-timeout"},
		{"blank URLs", natsconn.Config{URL: " , "}, "names no server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, natsconn.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
			// Connect checks the same before touching the network.
			if _, err := natsconn.Connect(t.Context(), tc.cfg, zerolog.Nop()); !errors.Is(err, natsconn.ErrInvalidConfig) {
				t.Fatalf("Connect: %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestMissingFilesAreConfigErrors(t *testing.T) {
	for _, cfg := range []natsconn.Config{
		{CredsFile: "/nonexistent/x.creds"},
		{TLSCA: "/nonexistent/ca.pem"},
		{TLSCert: "/nonexistent/c.pem", TLSKey: "/nonexistent/k.pem"},
	} {
		start := time.Now()
		_, err := natsconn.Connect(t.Context(), cfg, zerolog.Nop())
		if !errors.Is(err, natsconn.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", cfg, err)
		}
		if time.Since(start) > time.Second {
			t.Errorf("%+v: a config error must not wait for the timeout", cfg)
		}
	}
}

func TestConnectAndReconnect(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	var logs testutil.SyncBuffer
	log := zerolog.New(&logs)
	nc, err := natsconn.Connect(t.Context(), natsconn.Config{URL: srv.URL(), Name: "natsconn-test", ReconnectWait: 20 * time.Millisecond}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !nc.IsConnected() || nc.Opts.Name != "natsconn-test" || nc.Opts.MaxReconnect != -1 {
		t.Fatalf("connected %v, name %q, max reconnects %d", nc.IsConnected(), nc.Opts.Name, nc.Opts.MaxReconnect)
	}
	srv.Restart(t)
	waitFor(t, 5*time.Second, "reconnect", func() bool { return nc.Stats().Reconnects > 0 && nc.IsConnected() })
	waitFor(t, time.Second, "reconnect logs", func() bool {
		out := logs.String()
		return strings.Contains(out, "disconnected from NATS") && strings.Contains(out, "reconnected to NATS")
	})
	if err := nc.Publish("x", nil); err != nil {
		t.Fatal(err)
	}
	before := strings.Count(logs.String(), "disconnected from NATS")
	nc.Close()
	time.Sleep(50 * time.Millisecond) // callbacks run on the client's goroutine
	if strings.Count(logs.String(), "disconnected from NATS") != before {
		t.Fatalf("a deliberate Close was logged as a disconnect:\n%s", logs.String())
	}
}

func TestConnectWaitsForALateServer(t *testing.T) {
	t.Parallel()
	port := testutil.FreePort(t)
	url := "nats://127.0.0.1:" + itoa(port)
	started := make(chan *natstest.Server, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		started <- natstest.Start(t, func(o *server.Options) { o.Port = port })
	}()
	defer func() { (<-started).Shutdown() }()
	start := time.Now()
	nc, err := natsconn.Connect(t.Context(), natsconn.Config{URL: url, ConnectTimeout: 5 * time.Second}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("connected after %v, before the server started", d)
	}
}

func TestConnectGivesUpWithAClearError(t *testing.T) {
	t.Parallel()
	url := "nats://user:secret@127.0.0.1:" + itoa(testutil.FreePort(t))
	start := time.Now()
	_, err := natsconn.Connect(t.Context(), natsconn.Config{URL: url, ConnectTimeout: 300 * time.Millisecond}, zerolog.Nop())
	elapsed := time.Since(start)
	if !errors.Is(err, natsconn.ErrUnreachable) || !errors.Is(err, nats.ErrNoServers) {
		t.Fatalf("error %v, want ErrUnreachable wrapping nats.ErrNoServers", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "cannot reach NATS at nats://***@127.0.0.1:") || !strings.Contains(msg, "after 300ms") {
		t.Fatalf("message %q", msg)
	}
	if strings.Contains(msg, "secret") {
		t.Fatalf("message leaks the password: %q", msg)
	}
	if elapsed < 250*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("gave up after %v, want about 300ms", elapsed)
	}
}

func TestConnectStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := natsconn.Connect(ctx, natsconn.Config{URL: "nats://127.0.0.1:" + itoa(testutil.FreePort(t)), ConnectTimeout: time.Minute}, zerolog.Nop())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the context's", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("returned after %v", d)
	}
}

func TestAuthorizationErrorIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, func(o *server.Options) { o.Authorization = "s3cret" })
	start := time.Now()
	_, err := natsconn.Connect(t.Context(), natsconn.Config{URL: srv.URL(), Token: "wrong", ConnectTimeout: 5 * time.Second}, zerolog.Nop())
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("error %v, want nats.ErrAuthorization", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("an authorization error was retried for %v", d)
	}
	nc, err := natsconn.Connect(t.Context(), natsconn.Config{URL: srv.URL(), Token: "s3cret"}, zerolog.Nop())
	if err != nil {
		t.Fatalf("right token: %v", err)
	}
	nc.Close()
}

func itoa(n int) string { return strconv.Itoa(n) }
