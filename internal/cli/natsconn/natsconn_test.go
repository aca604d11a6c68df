package natsconn_test

import (
	"context"
	"errors"
	"flag"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRegisterFlags(t *testing.T) {
	var c natsconn.Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs)
	// An empty URL stays empty: each binary says what it means.
	// A zero ping interval stays zero: its default depends on the lease.
	if c.URL != "" || c.ConnectTimeout != natsconn.DefaultConnectTimeout || c.PingInterval != 0 {
		t.Fatalf("defaults: %+v", c)
	}
	for _, name := range []string{"nats", "creds", "user", "password", "password-file", "token", "token-file", "nkey", "tls-ca", "tls-cert", "tls-key", "nats-timeout", "nats-ping-interval"} {
		if fs.Lookup(name) == nil {
			t.Errorf("flag -%s not registered", name)
		}
	}
	err := fs.Parse([]string{"-nats", "nats://n1:4222,nats://n2:4222", "-user", "u", "-password", "p",
		"-tls-ca", "ca.pem", "-tls-cert", "c.pem", "-tls-key", "k.pem", "-nats-timeout", "3s", "-creds", "x.creds", "-token", "t",
		"-password-file", "pw", "-token-file", "tok", "-nkey", "seed.nk", "-nats-ping-interval", "2s"})
	if err != nil {
		t.Fatal(err)
	}
	want := natsconn.Config{URL: "nats://n1:4222,nats://n2:4222", User: "u", Password: "p", TLSCA: "ca.pem",
		TLSCert: "c.pem", TLSKey: "k.pem", ConnectTimeout: 3 * time.Second, CredsFile: "x.creds", Token: "t",
		PasswordFile: "pw", TokenFile: "tok", NkeyFile: "seed.nk", PingInterval: 2 * time.Second}
	if c != want {
		t.Fatalf("parsed %+v, want %+v", c, want)
	}
}

// A password or token that a configuration file set is bound to its flag
// as the default; -h must not print it.
func TestHelpHidesSecrets(t *testing.T) {
	c := natsconn.Config{User: "u", Password: "hunter2-password", Token: "hunter2-token"}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	c.RegisterFlags(fs)
	fs.PrintDefaults()
	help := out.String()
	if strings.Contains(help, "hunter2") {
		t.Fatalf("-h shows a secret:\n%s", help)
	}
	for _, want := range []string{"-password-file", "-token-file", "-nkey", natsconn.EnvPassword, natsconn.EnvToken, natsconn.EnvNkeySeedFile} {
		if !strings.Contains(help, want) {
			t.Errorf("-h does not mention %s:\n%s", want, help)
		}
	}
	// The values are still there, and a flag still sets them.
	if err := fs.Parse([]string{"-token", "other"}); err != nil || c.Password != "hunter2-password" || c.Token != "other" {
		t.Fatalf("parse: %v, %+v", err, c)
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
		{"creds and token", natsconn.Config{CredsFile: "f", Token: "t"}, "-creds and -token cannot be used together"},
		{"user and password file", natsconn.Config{User: "u", PasswordFile: "f"}, ""},
		{"token file", natsconn.Config{TokenFile: "f"}, ""},
		{"nkey", natsconn.Config{NkeyFile: "f"}, ""},
		{"password and password file", natsconn.Config{User: "u", Password: "p", PasswordFile: "f"}, "-password and -password-file"},
		{"password file alone", natsconn.Config{PasswordFile: "f"}, "-password needs -user"},
		{"token and token file", natsconn.Config{Token: "t", TokenFile: "f"}, "-token and -token-file cannot be used together"},
		{"user and nkey", natsconn.Config{User: "u", NkeyFile: "f"}, "-user and -nkey"},
		{"creds and nkey", natsconn.Config{CredsFile: "c", NkeyFile: "f"}, "-creds and -nkey"},
		{"user and token file", natsconn.Config{User: "u", TokenFile: "f"}, "-user and -token-file"},
		{"cert without key", natsconn.Config{TLSCert: "c"}, "-tls-cert and -tls-key"},
		{"key without cert", natsconn.Config{TLSKey: "k"}, "-tls-cert and -tls-key"},
		{"negative timeout", natsconn.Config{ConnectTimeout: -time.Second}, "-nats-timeout"},
		{"negative ping interval", natsconn.Config{PingInterval: -time.Second}, "-nats-ping-interval -1s is negative"},
		{"blank URLs", natsconn.Config{URL: " , "}, "names no server"},
		{"schemes nats.go knows", natsconn.Config{URL: "nats://a:4222,tls://b:4222,NATS://c,d:4222,e"}, ""},
		{"websocket", natsconn.Config{URL: "ws://a:8080,wss://b"}, ""},
		{"misspelt scheme", natsconn.Config{URL: "nat://127.0.0.1:4222"}, `-nats "nat://127.0.0.1:4222": unknown scheme "nat" (want nats, tls, ws, wss)`},
		{"http scheme", natsconn.Config{URL: "nats://a:4222,https://b:443"}, `unknown scheme "https"`},
		{"scheme of a URL with a password", natsconn.Config{URL: "nta://u:secret@a:4222"}, `-nats "nta://***@a:4222": unknown scheme`},
		{"no host", natsconn.Config{URL: "nats://:4222"}, "no host"},
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

// Every problem is reported, each by its YAML key (for a gateway's file)
// and by its flags (the error's text, for the command line).
func TestValidateProblems(t *testing.T) {
	cfg := natsconn.Config{URL: "nat://a:4222", User: "u", Token: "t", Password: "p", PasswordFile: "f", ConnectTimeout: -time.Second}
	err := cfg.Validate()
	var ps natsconn.Problems
	if !errors.As(err, &ps) || !errors.Is(err, natsconn.ErrInvalidConfig) {
		t.Fatalf("Validate = %v, want Problems wrapping ErrInvalidConfig", err)
	}
	want := natsconn.Problems{
		{"user", "cannot be used with token: choose one way to authenticate", "-user and -token cannot be used together: choose one way to authenticate"},
		{"password", "cannot be used with passwordFile", "-password and -password-file cannot be used together"},
		{"connectTimeout", "-1s is negative", "-nats-timeout -1s is negative"},
		{"url", `"nat://a:4222": unknown scheme "nat" (want nats, tls, ws, wss)`, `-nats "nat://a:4222": unknown scheme "nat" (want nats, tls, ws, wss)`},
	}
	if !slices.Equal(ps, want) {
		t.Errorf("problems\n got %q\nwant %q", ps, want)
	}
	if got := err.Error(); strings.Count(got, "natsconn: ") != 1 || !strings.HasSuffix(got, "; "+want[3].FlagMsg) {
		t.Errorf("error %q: want the prefix once, then each problem by its flags", got)
	}
}

// connectLogged runs Connect with a debug log, and returns what it
// returned and how many failed attempts it retried: the log's "NATS not
// reachable yet" lines, one before each wait for the next attempt.
func connectLogged(ctx context.Context, cfg natsconn.Config) (nc *nats.Conn, retries int, err error) {
	var logs testutil.SyncBuffer
	nc, err = natsconn.Connect(ctx, cfg, zerolog.New(&logs).Level(zerolog.DebugLevel))
	return nc, strings.Count(logs.String(), "NATS not reachable yet"), err
}

func TestMissingFilesAreConfigErrors(t *testing.T) {
	for _, cfg := range []natsconn.Config{
		{CredsFile: "/nonexistent/x.creds"},
		{TLSCA: "/nonexistent/ca.pem"},
		{TLSCert: "/nonexistent/c.pem", TLSKey: "/nonexistent/k.pem"},
		{User: "u", PasswordFile: "/nonexistent/password"},
		{TokenFile: "/nonexistent/token"},
		{NkeyFile: "/nonexistent/seed.nk"},
	} {
		// A config error ends Connect before any attempt: no retry, and
		// not the timeout's ErrUnreachable.
		_, retries, err := connectLogged(t.Context(), cfg)
		if !errors.Is(err, natsconn.ErrInvalidConfig) || errors.Is(err, natsconn.ErrUnreachable) || retries != 0 {
			t.Errorf("%+v: %v after %d retries, want ErrInvalidConfig at once", cfg, err, retries)
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
	testutil.Eventually(t, "reconnect", func() bool { return nc.Stats().Reconnects > 0 && nc.IsConnected() })
	testutil.Eventually(t, "reconnect logs", func() bool {
		out := logs.String()
		return strings.Contains(out, "disconnected from NATS") && strings.Contains(out, "reconnected to NATS")
	})
	if err := nc.Publish("x", nil); err != nil {
		t.Fatal(err)
	}
	before := strings.Count(logs.String(), "disconnected from NATS")
	nc.Close()
	// The client runs its callbacks in order on one goroutine, and Close
	// queues the disconnect callback before the closed one: once the closed
	// callback has logged, the disconnect callback has run too.
	testutil.Eventually(t, "the closed callback", func() bool { return strings.Contains(logs.String(), "NATS connection closed") })
	if strings.Count(logs.String(), "disconnected from NATS") != before {
		t.Fatalf("a deliberate Close was logged as a disconnect:\n%s", logs.String())
	}
}

func TestConnectWaitsForALateServer(t *testing.T) {
	t.Parallel()
	port := testutil.FreePort(t)
	url := "nats://127.0.0.1:" + itoa(port)
	var logs testutil.SyncBuffer
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := natsconn.Connect(t.Context(), natsconn.Config{URL: url, ConnectTimeout: 15 * time.Second}, zerolog.New(&logs))
		done <- result{nc, err}
	}()
	// The server starts only once an attempt has failed: Connect must retry.
	testutil.Eventually(t, "a failed connection attempt", func() bool { return strings.Contains(logs.String(), "NATS not reachable yet") })
	natstest.Start(t, func(o *server.Options) { o.Port = port })
	r := testutil.Receive(t, done, 20*time.Second, "Connect to return")
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.nc.Close()
	m := regexp.MustCompile(`"attempts":(\d+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no connection log:\n%s", logs.String())
	}
	if n, _ := strconv.Atoi(m[1]); n < 2 {
		t.Fatalf("connected after %d attempts, want a retry after the failure:\n%s", n, logs.String())
	}
}

func TestConnectGivesUpWithAClearError(t *testing.T) {
	t.Parallel()
	url := "nats://user:secret@127.0.0.1:" + itoa(testutil.FreePort(t))
	start := time.Now()
	_, retries, err := connectLogged(t.Context(), natsconn.Config{URL: url, ConnectTimeout: 300 * time.Millisecond})
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
	// ErrUnreachable comes only once the timeout has run out, after
	// retries: the timeout, not a first failure, ended the wait.
	if retries == 0 || elapsed < 300*time.Millisecond {
		t.Fatalf("gave up after %v and %d retries, want retries until the 300ms timeout", elapsed, retries)
	}
	t.Logf("gave up after %v and %d retries", elapsed, retries)
}

func TestConnectStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	// The context's error, not the minute's ErrUnreachable: the context
	// ended the wait.
	_, err := natsconn.Connect(ctx, natsconn.Config{URL: "nats://127.0.0.1:" + itoa(testutil.FreePort(t)), ConnectTimeout: time.Minute}, zerolog.Nop())
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, natsconn.ErrUnreachable) {
		t.Fatalf("error %v, want the context's", err)
	}
}

func TestAuthorizationErrorIsNotRetried(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t, func(o *server.Options) { o.Authorization = "s3cret" })
	_, retries, err := connectLogged(t.Context(), natsconn.Config{URL: srv.URL(), Token: "wrong", ConnectTimeout: 5 * time.Second})
	if !errors.Is(err, nats.ErrAuthorization) || retries != 0 {
		t.Fatalf("error %v after %d retries, want nats.ErrAuthorization at once", err, retries)
	}
	nc, err := natsconn.Connect(t.Context(), natsconn.Config{URL: srv.URL(), Token: "s3cret"}, zerolog.Nop())
	if err != nil {
		t.Fatalf("right token: %v", err)
	}
	nc.Close()
}

func itoa(n int) string { return strconv.Itoa(n) }
