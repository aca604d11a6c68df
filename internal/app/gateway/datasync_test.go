package gateway

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// The sync policy reaches the running embedded server: its JetStream
// configuration, as the server reports it (varz), holds what dataSync
// says, the default set explicitly.
func TestDataSyncReachesTheEmbeddedServer(t *testing.T) {
	for _, tc := range []struct {
		dataSync string
		always   bool
		interval time.Duration
	}{
		{"", false, DefaultDataSync},
		{"always", true, DefaultDataSync},
		{"30s", false, 30 * time.Second},
	} {
		t.Run("dataSync="+tc.dataSync, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.DataSync = tc.dataSync
			var logs testutil.SyncBuffer
			g := startGatewayLogging(t, cfg, zerolog.New(&logs))
			v, err := g.embedded.srv.Varz(nil)
			if err != nil {
				t.Fatal(err)
			}
			js := v.JetStream.Config
			if js == nil {
				t.Fatal("the embedded server reports no JetStream configuration")
			}
			if js.SyncAlways != tc.always || js.SyncInterval != tc.interval {
				t.Errorf("server's sync: always %v, interval %v; want always %v, interval %v", js.SyncAlways, js.SyncInterval, tc.always, tc.interval)
			}
			if js.StoreDir != filepath.Join(cfg.DataDir, "jetstream") {
				t.Errorf("store %s, want under %s", js.StoreDir, cfg.DataDir)
			}
			want := policyString(t, tc.dataSync)
			if !strings.Contains(logs.String(), `"dataSync":"`+want+`","message":"embedded NATS server with JetStream started"`) {
				t.Errorf("the start's log line does not say dataSync %s:\n%s", want, logs.String())
			}
		})
	}
}

// policyString is the policy dataSync s names, as the log writes it.
func policyString(t *testing.T, s string) string {
	t.Helper()
	p, err := parseDataSync(s)
	if err != nil {
		t.Fatal(err)
	}
	return p.String()
}

// A sync policy given without dataDir is applied, and the gateway warns
// that the temporary store keeps nothing across a restart anyway.
func TestDataSyncWithoutDataDirWarns(t *testing.T) {
	cfg := testConfig(t)
	cfg.DataDir, cfg.DataSync = "", "always"
	var logs testutil.SyncBuffer
	g := startGatewayLogging(t, cfg, zerolog.New(&logs))
	v, err := g.embedded.srv.Varz(nil)
	if err != nil || v.JetStream.Config == nil || !v.JetStream.Config.SyncAlways {
		t.Fatalf("varz error %v, JetStream %+v: want sync always", err, v.JetStream.Config)
	}
	if !strings.Contains(logs.String(), `"level":"warn","dataSync":"always","message":"dataSync without dataDir`) {
		t.Errorf("no warning about dataSync without dataDir:\n%s", logs.String())
	}
}

// dataSync is read from the YAML file and from -data-sync, the flag over
// the file; "always" in any case.
func TestDataSyncFileAndFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	os.WriteFile(path, []byte("embeddedNats: 127.0.0.1:4333\ndataDir: /var/lib/pushlb\ndataSync: always\n"), 0o600)
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataSync != "always" {
		t.Fatalf("dataSync %q from the file, want always", cfg.DataSync)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs)
	if fs.Lookup("data-sync").DefValue != "always" {
		t.Errorf("-data-sync's default %q, want the file's always", fs.Lookup("data-sync").DefValue)
	}
	if err := fs.Parse([]string{"-data-sync", "45s"}); err != nil {
		t.Fatal(err)
	}
	if cfg.DataSync != "45s" || cfg.DataDir != "/var/lib/pushlb" {
		t.Errorf("dataSync %q, dataDir %q: want 45s over the file, the file's directory", cfg.DataSync, cfg.DataDir)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	for in, want := range map[string]dataSync{
		"":       {interval: DefaultDataSync},
		"always": {always: true, interval: DefaultDataSync},
		"ALWAYS": {always: true, interval: DefaultDataSync},
		"1s":     {interval: time.Second},
		"5m":     {interval: 5 * time.Minute},
	} {
		def := DefaultConfig()
		fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
		def.RegisterFlags(fs)
		if err := fs.Parse([]string{"-data-sync", in}); err != nil {
			t.Fatal(err)
		}
		if err := def.Validate(); err != nil {
			t.Errorf("-data-sync %q: %v", in, err)
		}
		if got, err := parseDataSync(def.DataSync); err != nil || got != want {
			t.Errorf("-data-sync %q: %+v, %v; want %+v", in, got, err, want)
		}
	}
}

// A value that does not parse, a negative or too short interval, and a
// policy given with nats.url (no embedded server) are configuration
// errors that name the key, with the file's line.
func TestDataSyncErrors(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"dataSync: soon\n":       `bad.yaml:1: dataSync: "soon": want always (fsync every write) or a duration such as 30s (fsync at most that long after a write; default 2m0s)`,
		"dataSync: -5s\n":        "bad.yaml:1: dataSync: -5s is negative",
		"zone: a\ndataSync: 0\n": "bad.yaml:2: dataSync: 0s is below the minimum 1s (always: fsync every write)",
		"dataSync: 10ms\n":       "bad.yaml:1: dataSync: 10ms is below the minimum 1s",
		"nats: {url: nats://127.0.0.1:4222}\ndataSync: always\n": `bad.yaml:2: dataSync: "always": the embedded server's sync policy, but nats.url (-nats) is set and no server is embedded`,
	} {
		path := filepath.Join(dir, "bad.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		_, err := LoadFile(path)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q:\n got  %v\n want ...%s...", body, err, want)
		}
	}

	// By flag, the same errors name the key.
	for args, want := range map[string]string{
		"-data-sync sometimes":                      `dataSync: "sometimes": want always`,
		"-data-sync -1m":                            "dataSync: -1m0s is negative",
		"-data-sync 2m -nats nats://127.0.0.1:4222": `dataSync: "2m": the embedded server's sync policy, but nats.url (-nats) is set`,
	} {
		cfg := DefaultConfig()
		fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.RegisterFlags(fs)
		if err := fs.Parse(strings.Fields(args)); err != nil {
			t.Fatal(err)
		}
		err := cfg.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s:\n got  %v\n want ...%s...", args, err, want)
		}
	}
}
