package balancer_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pushlb/pushlb/balancer"
)

const loadExampleYAML = `
defaults:            # global defaults, over DefaultConfig()
  rule: ZoneAvoidance
  zone: a
clients:
  orders:
    rule: RoundRobin
    listOfServers: ["127.0.0.1:9001", "127.0.0.1:9002"]
    breaker: {threshold: 5}
`

func loadYAML(t *testing.T, src string) *balancer.ClientsConfig {
	t.Helper()
	cfg, err := balancer.LoadConfigYAML(strings.NewReader(src))
	if err != nil {
		t.Fatalf("LoadConfigYAML: %v", err)
	}
	return cfg
}

func TestLoadConfigYAMLMergesFieldByField(t *testing.T) {
	cfg := loadYAML(t, loadExampleYAML)

	wantDefaults := balancer.DefaultConfig()
	wantDefaults.Rule = balancer.RuleZoneAvoidance
	wantDefaults.Zone = "a"
	if !reflect.DeepEqual(cfg.Defaults, wantDefaults) {
		t.Errorf("defaults = %+v\nwant %+v", cfg.Defaults, wantDefaults)
	}

	wantOrders := wantDefaults
	wantOrders.Rule = balancer.RuleRoundRobin
	wantOrders.ListOfServers = []string{"127.0.0.1:9001", "127.0.0.1:9002"}
	wantOrders.Breaker.Threshold = 5 // factor and max stay the defaults'
	if got := cfg.For("orders"); !reflect.DeepEqual(got, wantOrders) {
		t.Errorf("For(orders) = %+v\nwant %+v", got, wantOrders)
	}
	if got := cfg.For("orders").Breaker; got.Factor != 10*time.Second || got.Max != 30*time.Second {
		t.Errorf("orders breaker = %+v, want the default factor and max", got)
	}
	if got := cfg.For("unknown"); !reflect.DeepEqual(got, wantDefaults) {
		t.Errorf("For(unknown) = %+v, want the defaults", got)
	}
	if got := cfg.Names(); !reflect.DeepEqual(got, []string{"orders"}) {
		t.Errorf("Names() = %v", got)
	}
	if len(cfg.IgnoredKeys) != 0 {
		t.Errorf("IgnoredKeys = %v, want none for YAML", cfg.IgnoredKeys)
	}
	for _, name := range []string{"orders", "other"} {
		b, err := balancer.New(name, cfg.For(name))
		if err != nil {
			t.Fatalf("New(%s): %v", name, err)
		}
		b.Close()
	}
}

func TestLoadConfigYAMLForReturnsACopy(t *testing.T) {
	cfg := loadYAML(t, loadExampleYAML)
	c := cfg.For("orders")
	c.ListOfServers[0] = "changed:1"
	c.Rule = balancer.RuleRandom
	if got := cfg.For("orders"); got.ListOfServers[0] != "127.0.0.1:9001" || got.Rule != balancer.RuleRoundRobin {
		t.Errorf("changing For's result changed the configuration: %+v", got)
	}
	var nilCfg *balancer.ClientsConfig
	if got := nilCfg.For("x"); !reflect.DeepEqual(got, balancer.DefaultConfig()) {
		t.Errorf("nil.For = %+v, want DefaultConfig()", got)
	}
}

func TestLoadConfigYAMLValues(t *testing.T) {
	cfg := loadYAML(t, `
defaults:
  zoneStatsInterval: 0
  retryTimeout: 750ms
clients:
  a:
    connectTimeout: 30s
    readTimeout: 1m30s
    zoneAware: no            # YAML 1.1 booleans, as yaml.v3 decodes them
    zoneAffinity: {maxLoadPerServer: 1, minAvailableServers: 0}
    listOfServers: "127.0.0.1:1, https://127.0.0.1:2"   # Ribbon's comma list
  b:
    zone: ""                 # "" clears the inherited zone
    rule: ~                  # null keeps the inherited value
  c:
`)
	a := cfg.For("a")
	if a.ConnectTimeout != 30*time.Second || a.ReadTimeout != 90*time.Second || a.RetryTimeout != 750*time.Millisecond {
		t.Errorf("durations: %v %v %v", a.ConnectTimeout, a.ReadTimeout, a.RetryTimeout)
	}
	if a.ZoneStatsInterval != 0 {
		t.Errorf("zoneStatsInterval = %v, want 0", a.ZoneStatsInterval)
	}
	if a.ZoneAware {
		t.Error("zoneAware: no gave true")
	}
	if a.ZoneAffinity.MaxLoadPerServer != 1 || a.ZoneAffinity.MinAvailableServers != 0 ||
		a.ZoneAffinity.MaxBlackoutPercentage != 0.8 {
		t.Errorf("zoneAffinity = %+v", a.ZoneAffinity)
	}
	if want := []string{"127.0.0.1:1", "https://127.0.0.1:2"}; !reflect.DeepEqual(a.ListOfServers, want) {
		t.Errorf("listOfServers = %q, want %q", a.ListOfServers, want)
	}
	if b := cfg.For("b"); b.Rule != balancer.RuleZoneAvoidance || b.Zone != "" {
		t.Errorf("b: rule %q zone %q", b.Rule, b.Zone)
	}
	if c, ok := cfg.Clients["c"]; !ok || !reflect.DeepEqual(c, cfg.Defaults) {
		t.Errorf("client with a null body: %+v, %v; want the defaults", c, ok)
	}
}

func TestLoadConfigYAMLAnchorsAndMergeKeys(t *testing.T) {
	cfg := loadYAML(t, `
defaults:
  zone: a
clients:
  orders: &orders
    rule: Random
    breaker: {threshold: 4}
  billing:
    <<: *orders
    breaker: {factor: 1s}
`)
	billing := cfg.For("billing")
	if billing.Rule != balancer.RuleRandom {
		t.Errorf("billing rule = %q, want Random from the merge", billing.Rule)
	}
	// A mapping's own key wins over the merged one, field by field.
	if billing.Breaker.Threshold != 4 || billing.Breaker.Factor != time.Second {
		t.Errorf("billing breaker = %+v, want threshold 4 (merged) and factor 1s (own)", billing.Breaker)
	}
}

func TestLoadConfigYAMLEmpty(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "---\n", "defaults:\nclients:\n"} {
		cfg := loadYAML(t, src)
		if !reflect.DeepEqual(cfg.Defaults, balancer.DefaultConfig()) || len(cfg.Clients) != 0 {
			t.Errorf("%q: %+v, want DefaultClientsConfig()", src, cfg)
		}
	}
}

func TestLoadConfigYAMLErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // substrings of the error
	}{
		{"unknown top-level key", "default:\n  rule: Random\n", []string{`"default"`, `did you mean "defaults"`, "line 1"}},
		{"unknown key in defaults", "defaults:\n  rul: Random\n", []string{"defaults", `"rul"`, `did you mean "rule"`}},
		{"unknown key in client", "clients:\n  orders:\n    listOfServer: [a]\n", []string{`client "orders"`, `"listOfServer"`, `"listOfServers"`, "line 3"}},
		{"wrong case", "clients:\n  orders:\n    ListOfServers: [a]\n", []string{`"ListOfServers"`, `did you mean "listOfServers"`}},
		{"unknown nested key", "clients:\n  orders:\n    breaker: {treshold: 5}\n", []string{`"breaker.treshold"`, `"breaker.threshold"`}},
		{"not a number", "clients:\n  orders:\n    breaker: {threshold: abc}\n", []string{`client "orders"`, "breaker.threshold", `"abc"`, "whole number"}},
		{"fraction for an int", "clients:\n  orders:\n    maxAutoRetries: 1.5\n", []string{"maxAutoRetries", `"1.5"`}},
		{"not a boolean", "clients:\n  orders:\n    zoneAware: maybe\n", []string{"zoneAware", `"maybe"`, "boolean"}},
		{"duration without unit", "defaults:\n  retryTimeout: 30\n", []string{"defaults", "retryTimeout", "unit", `"30s"`}},
		{"bad duration", "clients:\n  x:\n    ping: {interval: soon}\n", []string{"ping.interval", `"soon"`}},
		{"mapping for a scalar", "clients:\n  x:\n    rule: {a: b}\n", []string{"rule", "mapping"}},
		{"scalar for a struct", "clients:\n  x:\n    breaker: 5\n", []string{"breaker", `"5"`, "mapping"}},
		{"mapping for a list", "clients:\n  x:\n    listOfServers: {a: b}\n", []string{"listOfServers", "list"}},
		{"clients not a mapping", "clients: [a, b]\n", []string{"clients", "mapping"}},
		{"top level not a mapping", "- a\n", []string{"mapping"}},
		{"repeated key", "clients:\n  x:\n    rule: Random\n    rule: RoundRobin\n", []string{"rule (line 4)", "repeated", "line 3"}},
		{"repeated client", "clients:\n  x: {}\n  x: {}\n", []string{`client "x"`, "repeated"}},
		{"validation", "clients:\n  x:\n    breaker: {threshold: 0}\n", []string{`client "x"`, "breaker.threshold"}},
		{"unknown rule", "clients:\n  x:\n    rule: Fastest\n", []string{`client "x"`, `"Fastest"`}},
		{"invalid default", "defaults:\n  connectTimeout: 0s\n", []string{"defaults", "connectTimeout"}},
		{"bad server", "clients:\n  x:\n    listOfServers: [nohost]\n", []string{`client "x"`, "listOfServers[0]"}},
		{"syntax", "defaults:\n  rule: [\n", []string{"yaml"}},
		{"two documents", "defaults: {}\n---\nclients: {}\n", []string{"second YAML document"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := balancer.LoadConfigYAML(strings.NewReader(tt.src))
			if err == nil {
				t.Fatalf("no error; got %+v", cfg)
			}
			if !errors.Is(err, balancer.ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
		})
	}
}

func TestLoadConfigYAMLReportsEveryClient(t *testing.T) {
	_, err := balancer.LoadConfigYAML(strings.NewReader(
		"clients:\n  a:\n    rul: x\n  b:\n    zoneAware: maybe\n"))
	if err == nil || !strings.Contains(err.Error(), `client "a"`) || !strings.Contains(err.Error(), `client "b"`) {
		t.Fatalf("error %v should report both clients", err)
	}
}

// Whatever a ClientsConfig marshals to must load back to the same thing.
func TestLoadConfigYAMLRoundTrip(t *testing.T) {
	cfg := loadYAML(t, loadExampleYAML)
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back := loadYAML(t, string(out))
	if !reflect.DeepEqual(back, cfg) {
		t.Errorf("round trip changed the configuration:\n%s\ngot  %+v\nwant %+v", out, back, cfg)
	}
}

// A ClientsConfig can be a field of a larger configuration.
func TestLoadConfigYAMLEmbedded(t *testing.T) {
	var gateway struct {
		Listen   string                 `yaml:"listen"`
		Balancer balancer.ClientsConfig `yaml:"balancer"`
	}
	src := "listen: :8080\nbalancer:\n  clients:\n    orders: {rule: Random}\n"
	if err := yaml.Unmarshal([]byte(src), &gateway); err != nil {
		t.Fatal(err)
	}
	if gateway.Balancer.For("orders").Rule != balancer.RuleRandom {
		t.Errorf("orders = %+v", gateway.Balancer.For("orders"))
	}
	err := yaml.Unmarshal([]byte("balancer:\n  clients:\n    orders: {rul: Random}\n"), &gateway)
	if !errors.Is(err, balancer.ErrInvalidConfig) || !strings.Contains(err.Error(), `"rul"`) {
		t.Errorf("embedded unknown key: %v", err)
	}
}

func TestLoadConfigFile(t *testing.T) {
	cfg, err := balancer.LoadConfigFile(filepath.Join("..", "testdata", "config", "clients.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	orders := cfg.For("orders")
	if orders.Rule != balancer.RuleRoundRobin || orders.Zone != "a" || orders.ConnectTimeout != 500*time.Millisecond ||
		orders.Breaker != (balancer.BreakerConfig{Threshold: 5, Factor: 10 * time.Second, Max: 30 * time.Second}) {
		t.Errorf("orders = %+v", orders)
	}
	payments := cfg.For("payments")
	if payments.Rule != balancer.RuleAvailabilityFiltering || payments.Filter != balancer.FilterZoneAffinity ||
		!payments.ZoneAffinity.Exclusive || payments.ZoneAffinity.MaxLoadPerServer != 0.6 ||
		payments.Ping != (balancer.PingConfig{Kind: balancer.PingHTTP, Path: "/ready", Interval: 10 * time.Second, Timeout: 2 * time.Second}) ||
		payments.ReadTimeout != 2*time.Second || payments.ActiveConnectionsLimit != 100 {
		t.Errorf("payments = %+v", payments)
	}

	props, err := balancer.LoadConfigFile(filepath.Join("..", "testdata", "ribbon", "service-provider.properties"))
	if err != nil {
		t.Fatal(err)
	}
	if props.For("service-provider").Rule != balancer.RuleAvailabilityFiltering {
		t.Errorf("properties file: %+v", props.For("service-provider"))
	}

	dir := t.TempDir()
	bad := filepath.Join(dir, "clients.yml")
	if err := os.WriteFile(bad, []byte("clients:\n  x: {rul: a}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := balancer.LoadConfigFile(bad); !errors.Is(err, balancer.ErrInvalidConfig) || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad .yml file: %v, want ErrInvalidConfig naming the path", err)
	}
	if _, err := balancer.LoadConfigFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want fs.ErrNotExist", err)
	}
	if _, err := balancer.LoadConfigFile(filepath.Join(dir, "clients.json")); !errors.Is(err, balancer.ErrInvalidConfig) {
		t.Errorf("unknown extension: %v, want ErrInvalidConfig", err)
	}
}

func TestLoadClientsConfigCloneAndValidate(t *testing.T) {
	cfg := loadYAML(t, loadExampleYAML)
	c := cfg.Clone()
	c.Clients["orders"].ListOfServers[0] = "changed:1"
	c.Defaults.Zone = "b"
	if cfg.For("orders").ListOfServers[0] != "127.0.0.1:9001" || cfg.Defaults.Zone != "a" {
		t.Error("changing a clone changed the original")
	}
	bad := balancer.DefaultClientsConfig()
	x := balancer.DefaultConfig()
	x.Rule = "Nope"
	bad.Clients["x"] = x
	if err := bad.Validate(); !errors.Is(err, balancer.ErrInvalidConfig) || !strings.Contains(err.Error(), `client "x"`) {
		t.Errorf("Validate = %v", err)
	}
}
