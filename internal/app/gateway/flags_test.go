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
		"lease: 1ms\n":                                       "bad.yaml: gateway: invalid config: lease: 1ms is below the minimum",
		"registryReplicas: 6\n":                              "bad.yaml: gateway: invalid config: registryReplicas: 6: 1 to 5",
	} {
		path := filepath.Join(dir, "bad.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		_, err := LoadFile(path)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q:\n got  %v\n want ...%s...", body, err, want)
		}
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
