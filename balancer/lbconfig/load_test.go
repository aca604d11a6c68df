package lbconfig_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/balancer/lbconfig"
	"github.com/pushlb/pushlb/internal/base/yamlx"
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
	cfg, err := lbconfig.LoadYAML(strings.NewReader(src))
	if err != nil {
		t.Fatalf("LoadYAML: %v", err)
	}
	return cfg
}

func TestLoadYAMLMergesFieldByField(t *testing.T) {
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

func TestLoadYAMLForReturnsACopy(t *testing.T) {
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

func TestLoadYAMLValues(t *testing.T) {
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

func TestLoadYAMLAnchorsAndMergeKeys(t *testing.T) {
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

func TestLoadYAMLEmpty(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "---\n", "defaults:\nclients:\n"} {
		cfg := loadYAML(t, src)
		if !reflect.DeepEqual(cfg.Defaults, balancer.DefaultConfig()) || len(cfg.Clients) != 0 {
			t.Errorf("%q: %+v, want DefaultClientsConfig()", src, cfg)
		}
	}
}

func TestLoadYAMLErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // substrings of the error
	}{
		{"unknown top-level key", "default:\n  rule: Random\n", []string{`line 1: default: unknown key (did you mean "defaults"?)`}},
		{"unknown key in defaults", "defaults:\n  rul: Random\n", []string{`line 2: defaults.rul: unknown key (did you mean "rule"?)`}},
		{"unknown key in client", "clients:\n  orders:\n    listOfServer: [a]\n", []string{`line 3: clients.orders.listOfServer: unknown key (did you mean "listOfServers"?)`}},
		{"wrong case", "clients:\n  orders:\n    ListOfServers: [a]\n", []string{`clients.orders.ListOfServers: unknown key (did you mean "listOfServers"?)`}},
		{"unknown nested key", "clients:\n  orders:\n    breaker: {treshold: 5}\n", []string{`clients.orders.breaker.treshold: unknown key (did you mean "threshold"?)`}},
		{"not a number", "clients:\n  orders:\n    breaker: {threshold: abc}\n", []string{`line 3: clients.orders.breaker.threshold: "abc" is not a whole number`}},
		{"fraction for an int", "clients:\n  orders:\n    maxAutoRetries: 1.5\n", []string{"maxAutoRetries", `"1.5"`}},
		{"not a boolean", "clients:\n  orders:\n    zoneAware: maybe\n", []string{"zoneAware", `"maybe"`, "boolean"}},
		{"duration without unit", "defaults:\n  retryTimeout: 30\n", []string{`line 2: defaults.retryTimeout: "30" is not a duration (write it with a unit, e.g. 30s)`}},
		{"bad duration", "clients:\n  x:\n    ping: {interval: soon}\n", []string{"ping.interval", `"soon"`}},
		{"mapping for a scalar", "clients:\n  x:\n    rule: {a: b}\n", []string{"rule", "mapping"}},
		{"scalar for a struct", "clients:\n  x:\n    breaker: 5\n", []string{"breaker", `"5"`, "mapping"}},
		{"mapping for a list", "clients:\n  x:\n    listOfServers: {a: b}\n", []string{"listOfServers", "list"}},
		{"clients not a mapping", "clients: [a, b]\n", []string{"clients", "mapping"}},
		{"top level not a mapping", "- a\n", []string{"mapping"}},
		{"repeated key", "clients:\n  x:\n    rule: Random\n    rule: RoundRobin\n", []string{"line 4: clients.x.rule: repeated key (first at line 3)"}},
		{"repeated client", "clients:\n  x: {}\n  x: {}\n", []string{"line 3: clients.x: client repeated (first at line 2)"}},
		{"validation", "clients:\n  x:\n    breaker: {threshold: 0}\n", []string{"line 3: clients.x.breaker.threshold: ", "at least 1"}},
		{"validation of an inherited value", "defaults:\n  ping: {interval: 0s}\nclients:\n  x:\n    ping: {kind: http}\n",
			[]string{"line 4: clients.x.ping.interval: ", "must be positive"}},
		{"validation through a merge", "a: &a {retryTimeout: 0s}\nclients:\n  x:\n    <<: *a\n", []string{"line 1: a: unknown key"}},
		{"validation of a merged value", "clients:\n  a: &a\n    retryTimeout: 0s\n  x:\n    <<: *a\n",
			[]string{"line 3: clients.a.retryTimeout: ", "line 3: clients.x.retryTimeout: ", "must be positive"}},
		{"unknown rule", "clients:\n  x:\n    rule: Fastest\n", []string{`line 3: clients.x.rule: unknown rule "Fastest"`}},
		{"invalid default", "defaults:\n  connectTimeout: 0s\n", []string{"line 2: defaults.connectTimeout: "}},
		{"bad server", "clients:\n  x:\n    listOfServers: [a:1, nohost]\n", []string{"line 3: clients.x.listOfServers[1]: ", "nohost"}},
		{"syntax", "defaults:\n  rule: [\n", []string{"line 2: invalid YAML: "}},
		{"two documents", "defaults: {}\n---\nclients: {}\n", []string{"second YAML document"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := lbconfig.LoadYAML(strings.NewReader(tt.src))
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

func TestLoadYAMLReportsEveryClient(t *testing.T) {
	_, err := lbconfig.LoadYAML(strings.NewReader(
		"clients:\n  a:\n    rul: x\n  b:\n    zoneAware: maybe\n"))
	if err == nil || !strings.Contains(err.Error(), `line 3: clients.a.rul`) || !strings.Contains(err.Error(), `line 5: clients.b.zoneAware`) {
		t.Fatalf("error %v should report both clients", err)
	}
}

// One pass reports every mistake: a typo hides neither the range errors
// beside it nor the clients after bad defaults, and a default out of range
// is reported once, not again for every client inheriting it.
func TestLoadYAMLTypoHidesNothing(t *testing.T) {
	_, err := lbconfig.LoadYAML(strings.NewReader(`defaults:
  rul: x
  connectTimeout: 0s
clients:
  a:
    rulee: y
    breaker: {threshold: 0}
  b: {zoneAware: maybe}
`))
	for _, want := range []string{
		`line 2: defaults.rul: unknown key`,
		`line 3: defaults.connectTimeout: `,
		`line 6: clients.a.rulee: unknown key`,
		`line 7: clients.a.breaker.threshold: `,
		`line 8: clients.b.zoneAware: "maybe"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\ndoes not say %s", err, want)
		}
	}
	if n := strings.Count(fmt.Sprint(err), "connectTimeout:"); n != 1 {
		t.Errorf("the bad default is reported %d times:\n%v", n, err)
	}
	if !errors.Is(err, balancer.ErrInvalidConfig) {
		t.Errorf("%v does not wrap ErrInvalidConfig", err)
	}
}

// Whatever a ClientsConfig marshals to must load back to the same thing.
func TestLoadYAMLRoundTrip(t *testing.T) {
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
func TestLoadYAMLEmbedded(t *testing.T) {
	var gateway struct {
		Listen   string           `yaml:"listen"`
		Balancer lbconfig.Section `yaml:"balancer"`
	}
	src := "listen: :8080\nbalancer:\n  clients:\n    orders: {rule: Random}\n"
	if err := yaml.Unmarshal([]byte(src), &gateway); err != nil {
		t.Fatal(err)
	}
	if gateway.Balancer.For("orders").Rule != balancer.RuleRandom {
		t.Errorf("orders = %+v", gateway.Balancer.For("orders"))
	}
	err := yaml.Unmarshal([]byte("balancer:\n  clients:\n    orders: {rul: Random}\n"), &gateway)
	if !errors.Is(err, balancer.ErrInvalidConfig) || !strings.Contains(err.Error(), `line 3: clients.orders.rul: unknown key`) {
		t.Errorf("embedded unknown key: %v", err)
	}
}

func TestLoadFile(t *testing.T) {
	cfg, err := lbconfig.LoadFile(filepath.Join("..", "..", "testdata", "config", "clients.yaml"))
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

	props, err := lbconfig.LoadFile(filepath.Join("..", "..", "testdata", "ribbon", "service-provider.properties"))
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
	if _, err := lbconfig.LoadFile(bad); !errors.Is(err, balancer.ErrInvalidConfig) || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad .yml file: %v, want ErrInvalidConfig naming the path", err)
	}
	if _, err := lbconfig.LoadFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v, want fs.ErrNotExist", err)
	}
	if _, err := lbconfig.LoadFile(filepath.Join(dir, "clients.json")); !errors.Is(err, balancer.ErrInvalidConfig) {
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

// In a file decoded by internal/yamlx, as the gateway's, a Section's
// errors name the file and the whole key path.
func TestSectionInAStrictFile(t *testing.T) {
	type gatewayConfig struct {
		Listen   string           `yaml:"listen"`
		Balancer lbconfig.Section `yaml:"balancer"`
	}
	var cfg gatewayConfig
	src := "listen: :8080\nbalancer:\n  defaults: {zone: a}\n  clients:\n    orders: {rule: RoundRobinRule}\n"
	if err := yamlx.DecodeFile("gw.yaml", []byte(src), &cfg); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Balancer.For("orders"); got.Rule != balancer.RuleRoundRobin || got.Zone != "a" {
		t.Errorf("orders = %+v", got)
	}

	cfg = gatewayConfig{}
	if err := yamlx.DecodeFile("gw.yaml", []byte("listen: :1\nbalancer:\n"), &cfg); err != nil || cfg.Balancer.ClientsConfig != nil {
		t.Errorf("null section: %v, %+v; want no error and a nil ClientsConfig", err, cfg.Balancer)
	}

	src = "listen: :8080\nbalancer:\n  clients:\n    orders:\n      rule: Random\n      breaker: {treshold: 1}\n    billing: {ping: {kind: http, interval: 0s}}\n"
	err := yamlx.DecodeFile("gw.yaml", []byte(src), &cfg)
	for _, want := range []string{
		`gw.yaml:6: balancer.clients.orders.breaker.treshold: unknown key (did you mean "threshold"?)`,
		`gw.yaml:7: balancer.clients.billing.ping.interval: `,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\ndoes not say %s", err, want)
		}
	}
	if !errors.Is(err, balancer.ErrInvalidConfig) || !errors.Is(err, yamlx.ErrInvalid) {
		t.Errorf("%v should wrap ErrInvalidConfig and yamlx.ErrInvalid", err)
	}

	out, err := yaml.Marshal(lbconfig.Section{ClientsConfig: loadYAML(t, loadExampleYAML)})
	if err != nil {
		t.Fatal(err)
	}
	var back lbconfig.Section
	if err := yaml.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back.ClientsConfig, loadYAML(t, loadExampleYAML)) {
		t.Errorf("a marshalled Section does not load back: %v\n%s", err, out)
	}
}

func TestLoadYAMLLists(t *testing.T) {
	cfg := loadYAML(t, `
defaults:
  listOfServers: a:1, b:2
clients:
  inherits: {listOfServers: ~}
  cleared: {listOfServers: ""}
  empty: {listOfServers: []}
  one: {listOfServers: c:3}
`)
	if got := cfg.For("inherits").ListOfServers; !reflect.DeepEqual(got, []string{"a:1", "b:2"}) {
		t.Errorf("null: %q, want the defaults'", got)
	}
	for _, name := range []string{"cleared", "empty"} {
		if got := cfg.For(name).ListOfServers; got != nil {
			t.Errorf("%s: %q, want nil", name, got)
		}
	}
	if got := cfg.For("one").ListOfServers; !reflect.DeepEqual(got, []string{"c:3"}) {
		t.Errorf("one: %q", got)
	}
}

// TestLoadYAMLOutlierAndPanic: outlier detection and the panic threshold
// are read from YAML, defaults kept for what is not set, and a bad value
// is refused naming its key path.
func TestLoadYAMLOutlierAndPanic(t *testing.T) {
	cfg, err := lbconfig.LoadYAML(strings.NewReader("defaults:\n  panicThreshold: 50\n  outlierDetection:\n    consecutive5xx: 5\n    baseEjectionTime: 10s\n"))
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.For("orders")
	if c.PanicThreshold != 50 || c.OutlierDetection.Consecutive5xx != 5 || c.OutlierDetection.BaseEjectionTime != 10*time.Second ||
		c.OutlierDetection.MaxEjectionTime != 300*time.Second || c.OutlierDetection.MaxEjectionPercent != 10 {
		t.Fatalf("read %+v, panic threshold %v", c.OutlierDetection, c.PanicThreshold)
	}
	_, err = lbconfig.LoadYAML(strings.NewReader("clients:\n  orders:\n    outlierDetection:\n      maxEjectionPercent: 150\n"))
	if err == nil || !strings.Contains(err.Error(), "clients.orders.outlierDetection.maxEjectionPercent") {
		t.Fatalf("want an error naming clients.orders.outlierDetection.maxEjectionPercent, got %v", err)
	}
}
