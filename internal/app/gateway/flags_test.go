package gateway

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// Flags given on the command line override the file; the others keep the
// file's values, NATS and gossip flags included.
func TestFlagsOverTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	os.WriteFile(path, []byte(`
listen: 127.0.0.1:9000
zone: a
lease: 45s
registryReplicas: 3
nats: {url: "nats://n1:4222,nats://n2:4222", user: u, password: p, connectTimeout: 3s}
gossip: {bind: 127.0.0.1:7946, profile: fast}
`), 0o600)
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"-zone", "b", "-nats", "nats://n3:4222", "-gossip-profile", "lan"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Zone != "b" || cfg.NATS.URL != "nats://n3:4222" || cfg.Gossip.Profile != "lan" {
		t.Errorf("flags did not override: zone %q, nats %q, profile %q", cfg.Zone, cfg.NATS.URL, cfg.Gossip.Profile)
	}
	if cfg.Listen != "127.0.0.1:9000" || cfg.Lease != 45*time.Second || cfg.RegistryReplicas != 3 || cfg.NATS.User != "u" || cfg.NATS.ConnectTimeout != 3*time.Second || cfg.Gossip.Bind != "127.0.0.1:7946" {
		t.Errorf("file values lost: %+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	// Without a file, an empty -nats means the embedded server.
	def := DefaultConfig()
	fs = flag.NewFlagSet("gateway", flag.ContinueOnError)
	def.RegisterFlags(fs)
	if def.NATS.URL != "" || fs.Lookup("nats").DefValue != "" {
		t.Errorf("default NATS URL %q (flag default %q), want empty (embedded)", def.NATS.URL, fs.Lookup("nats").DefValue)
	}
}

// Every section's errors name the file, the line and the key.
func TestConfigErrorsNameFileAndKey(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"lease: 30\n":                                        "bad.yaml:1: lease:",
		"nats: {urll: x}\n":                                  `bad.yaml:1: nats.urll: unknown key (did you mean "url"?)`,
		"subscriber:\n  coalesce: soon\n":                    "bad.yaml:2: subscriber.coalesce:",
		"gossip: {profil: fast}\n":                           "bad.yaml:1: gossip.profil: unknown key",
		"routes: [{prefix: /a, servce: x}]\n":                "bad.yaml:1: routes[0].servce: unknown key",
		"balancer:\n  clients:\n    orders: {rul: Random}\n": "bad.yaml:3: balancer.clients.orders.rul: unknown key",
		"lease: 1ms\n":                                       "bad.yaml:1: lease: 1ms is below the minimum",
		"zone: a\nregistryReplicas: 6\n":                     "bad.yaml:2: registryReplicas: 6: 1 to 5",
		"nats:\n  connectTimeout: -1s\n":                     "bad.yaml:2: nats.connectTimeout: -1s is negative",
		"gossip:\n  profile: wan\n":                          `bad.yaml:1: gossip: unknown Profile "wan"`,
		"routes:\n  - {prefix: /a, service: a}\n  - {prefix: b, service: b}\n": `bad.yaml:3: routes[1].prefix: "b" must start with /`,
		"routes:\n  - prefix: /a\n    service: a\n    zoneHeader: \"a b\"\n":   `bad.yaml:4: routes[0].zoneHeader: "a b" is not a valid header name`,
	} {
		path := filepath.Join(dir, "bad.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		_, err := LoadFile(path)
		// The prefix first, then the file, as the unknown keys' errors.
		if !errors.Is(err, ErrConfig) || !strings.HasPrefix(err.Error(), "gateway: invalid config: "+dir) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q:\n got  %v\n want ...%s...", body, err, want)
		}
	}
}

// One pass reports every mistake of a file, typos and values out of range
// alike (a typo in the balancer section hides neither its range errors
// nor the keys after it), in line order, each with the file, the line and
// the key, and each package's prefix once.
func TestConfigErrorsAllInOnePass(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.yaml")
	os.WriteFile(path, []byte(`lease: -5s
listn: x
nats:
  url: nat://127.0.0.1:4222
  connectTimeout: -1s
gossip: {profile: wan}
balancer:
  clients:
    orders: {rul: Random, maxAutoRetries: -2}
registryReplicas: 9
`), 0o600)
	_, err := LoadFile(path)
	want := `gateway: invalid config: ` + path + `:1: lease: -5s is below the minimum 1s (0: the bucket's)
` + path + `:2: listn: unknown key (did you mean "listen"?)
` + path + `:4: nats.url: "nat://127.0.0.1:4222": unknown scheme "nat" (want nats, tls, ws, wss)
` + path + `:5: nats.connectTimeout: -1s is negative
` + path + `:6: gossip: unknown Profile "wan" (want "lan" or "fast")
` + path + `:9: balancer.clients.orders.rul: unknown key (did you mean "rule"?)
` + path + `:9: balancer.clients.orders.maxAutoRetries: maxAutoRetries = -2: must not be negative
` + path + `:10: registryReplicas: 9: 1 to 5, or 0 for min(3, the cluster's JetStream servers)`
	if err == nil || err.Error() != want {
		t.Fatalf("error\n got %v\nwant %s", err, want)
	}
	for _, sentinel := range []error{ErrConfig, natsconn.ErrInvalidConfig, gossip.ErrInvalidConfig, balancer.ErrInvalidConfig} {
		if !errors.Is(err, sentinel) {
			t.Errorf("the error does not wrap %v", sentinel)
		}
	}
}

// Settings given by flag (no file) are reported all at once too, natsconn's
// by their flags, each package's prefix once: not "nats: natsconn: invalid
// config" nor "gossip: gossip: invalid config".
func TestValidateReportsEachProblemOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lease = time.Millisecond
	cfg.NATS.ConnectTimeout = -time.Second
	cfg.Gossip.Profile = "wan"
	err := cfg.Validate()
	want := `gateway: invalid config: -nats-timeout -1s is negative
lease: 1ms is below the minimum 1s (0: the bucket's)
gossip: unknown Profile "wan" (want "lan" or "fast")`
	if err == nil || err.Error() != want {
		t.Fatalf("error\n got %v\nwant %s", err, want)
	}
	if !errors.Is(err, ErrConfig) || !errors.Is(err, natsconn.ErrInvalidConfig) || !errors.Is(err, gossip.ErrInvalidConfig) {
		t.Errorf("%v does not wrap every sentinel", err)
	}
}

// Ribbon keys that pushlb ignores on purpose are logged at start, as
// docs/config.md promises.
func TestIgnoredRibbonKeysLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.properties")
	os.WriteFile(path, []byte("orders.ribbon.NIWSServerListClassName=com.netflix.niws.loadbalancer.DiscoveryEnabledNIWSServerList\n"+
		"orders.ribbon.NFLoadBalancerRuleClassName=com.netflix.loadbalancer.RandomRule\n"), 0o600)
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tc := testConfig(t)
	cfg.Listen, cfg.Admin, cfg.EmbeddedNATS, cfg.DataDir = tc.Listen, tc.Admin, tc.EmbeddedNATS, tc.DataDir
	var logs testutil.SyncBuffer
	g, err := New(cfg, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	if err := g.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `"key":"orders.ribbon.NIWSServerListClassName","message":"Ribbon key ignored`) {
		t.Fatalf("no warning for the ignored key in:\n%s", logs.String())
	}
}
