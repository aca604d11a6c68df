package natsconn_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// writeFile writes content to a new file of the test, readable by its
// owner only, and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// clearSecretEnv unsets the secret variables for the test, whatever the
// environment running the tests holds.
func clearSecretEnv(t *testing.T) {
	for _, name := range []string{natsconn.EnvPassword, natsconn.EnvToken, natsconn.EnvNkeySeedFile} {
		t.Setenv(name, "")
	}
}

// The precedence: a flag or file value wins over the environment; each
// variable applies only where the command line leaves its secret unset.
func TestResolve(t *testing.T) {
	pwFile := writeFile(t, "password", "from-file\n")
	tokFile := writeFile(t, "token", "tok-from-file\r\n")
	for _, tc := range []struct {
		name string
		cfg  natsconn.Config
		env  map[string]string
		want natsconn.Config
		err  string // substring of the error; "" for none
	}{
		{"nothing", natsconn.Config{}, nil, natsconn.Config{}, ""},
		{"password file", natsconn.Config{User: "u", PasswordFile: pwFile}, nil,
			natsconn.Config{User: "u", Password: "from-file"}, ""},
		{"password from the environment", natsconn.Config{User: "u"}, map[string]string{natsconn.EnvPassword: "from-env"},
			natsconn.Config{User: "u", Password: "from-env"}, ""},
		{"the flag wins over the environment", natsconn.Config{User: "u", Password: "from-flag"}, map[string]string{natsconn.EnvPassword: "from-env"},
			natsconn.Config{User: "u", Password: "from-flag"}, ""},
		{"the file wins over the environment", natsconn.Config{User: "u", PasswordFile: pwFile}, map[string]string{natsconn.EnvPassword: "from-env"},
			natsconn.Config{User: "u", Password: "from-file"}, ""},
		{"a password without a user is ignored", natsconn.Config{}, map[string]string{natsconn.EnvPassword: "from-env"},
			natsconn.Config{}, ""},
		{"token file", natsconn.Config{TokenFile: tokFile}, nil, natsconn.Config{Token: "tok-from-file"}, ""},
		{"token from the environment", natsconn.Config{}, map[string]string{natsconn.EnvToken: "tok-env"},
			natsconn.Config{Token: "tok-env"}, ""},
		{"the token flag wins", natsconn.Config{Token: "tok-flag"}, map[string]string{natsconn.EnvToken: "tok-env"},
			natsconn.Config{Token: "tok-flag"}, ""},
		{"other credentials shut the token variable out", natsconn.Config{User: "u"}, map[string]string{natsconn.EnvToken: "tok-env"},
			natsconn.Config{User: "u"}, ""},
		{"a URL's credentials shut the token variable out", natsconn.Config{URL: "nats://tok@h:4222"}, map[string]string{natsconn.EnvToken: "tok-env"},
			natsconn.Config{URL: "nats://tok@h:4222"}, ""},
		{"seed file from the environment", natsconn.Config{}, map[string]string{natsconn.EnvNkeySeedFile: "/k/seed.nk"},
			natsconn.Config{NkeyFile: "/k/seed.nk"}, ""},
		{"the -nkey flag wins", natsconn.Config{NkeyFile: "/flag.nk"}, map[string]string{natsconn.EnvNkeySeedFile: "/k/seed.nk"},
			natsconn.Config{NkeyFile: "/flag.nk"}, ""},
		{"creds shut the seed variable out", natsconn.Config{CredsFile: "x.creds"}, map[string]string{natsconn.EnvNkeySeedFile: "/k/seed.nk"},
			natsconn.Config{CredsFile: "x.creds"}, ""},
		{"token and seed variables", natsconn.Config{}, map[string]string{natsconn.EnvToken: "t", natsconn.EnvNkeySeedFile: "/k"},
			natsconn.Config{}, "both " + natsconn.EnvToken + " and " + natsconn.EnvNkeySeedFile},
		{"empty password file", natsconn.Config{User: "u", PasswordFile: writeFile(t, "empty", "\n")}, nil,
			natsconn.Config{}, "is empty"},
		{"invalid combination", natsconn.Config{User: "u", Token: "t"}, nil, natsconn.Config{}, "-user and -token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearSecretEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got, err := tc.cfg.Resolve()
			if tc.err != "" {
				if !errors.Is(err, natsconn.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want ErrInvalidConfig mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("resolved %+v, want %+v", got, tc.want)
			}
			if again, err := got.Resolve(); err != nil || again != got {
				t.Fatalf("Resolve is not idempotent: %+v, %v", again, err)
			}
		})
	}
}

// Errors about secret files name the file, never the secret, and never
// wait for the connect timeout.
func TestSecretErrorsShowNoSecret(t *testing.T) {
	clearSecretEnv(t)
	huge := writeFile(t, "huge", strings.Repeat("s3cret", 20000))
	seed := writeFile(t, "bad.nk", "s3cret-not-a-seed")
	for _, cfg := range []natsconn.Config{{User: "u", PasswordFile: huge}, {NkeyFile: seed}} {
		_, retries, err := connectLogged(t.Context(), cfg)
		if !errors.Is(err, natsconn.ErrInvalidConfig) || retries != 0 {
			t.Fatalf("%+v: %v after %d retries, want ErrInvalidConfig at once", cfg, err, retries)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("the error shows the secret: %v", err)
		}
	}
}

// Every secret, from a file or from the environment, authenticates against
// a real server; the logs of the connection never show it.
func TestSecretsAuthenticate(t *testing.T) {
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	seedFile := writeFile(t, "user.nk", string(seed)+"\n")

	passwords := natstest.Start(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "svc", Password: "pw-s3cret"}}
	})
	tokens := natstest.Start(t, func(o *server.Options) { o.Authorization = "tok-s3cret" })
	nkeyed := natstest.Start(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })

	for _, tc := range []struct {
		name string
		srv  *natstest.Server
		cfg  natsconn.Config
		env  map[string]string
	}{
		{"-password-file", passwords, natsconn.Config{User: "svc", PasswordFile: writeFile(t, "pw", "pw-s3cret\n")}, nil},
		{natsconn.EnvPassword, passwords, natsconn.Config{User: "svc"}, map[string]string{natsconn.EnvPassword: "pw-s3cret"}},
		{"-token-file", tokens, natsconn.Config{TokenFile: writeFile(t, "tok", "tok-s3cret")}, nil},
		{natsconn.EnvToken, tokens, natsconn.Config{}, map[string]string{natsconn.EnvToken: "tok-s3cret"}},
		{"-nkey", nkeyed, natsconn.Config{NkeyFile: seedFile}, nil},
		{natsconn.EnvNkeySeedFile, nkeyed, natsconn.Config{}, map[string]string{natsconn.EnvNkeySeedFile: seedFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearSecretEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var logs testutil.SyncBuffer
			cfg := tc.cfg
			cfg.URL = tc.srv.URL()
			nc, err := natsconn.Connect(t.Context(), cfg, zerolog.New(&logs).Level(zerolog.DebugLevel))
			if err != nil {
				t.Fatal(err)
			}
			nc.Close()
			testutil.Eventually(t, "the closed callback", func() bool { return strings.Contains(logs.String(), "NATS connection closed") })
			if out := logs.String(); strings.Contains(out, "s3cret") || strings.Contains(out, string(seed)) {
				t.Fatalf("the logs show a secret:\n%s", out)
			}
		})
	}

	// A wrong secret from the environment is an authorization error at
	// once, as a wrong flag is.
	clearSecretEnv(t)
	t.Setenv(natsconn.EnvToken, "wrong")
	_, retries, err := connectLogged(t.Context(), natsconn.Config{URL: tokens.URL()})
	if !errors.Is(err, nats.ErrAuthorization) || retries != 0 {
		t.Fatalf("wrong token: %v after %d retries, want nats.ErrAuthorization at once", err, retries)
	}
}
