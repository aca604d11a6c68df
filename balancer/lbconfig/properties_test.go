package lbconfig

import (
	"context"
	"errors"
	"github.com/pushlb/pushlb/balancer"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a balancer.Clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func loadProps(t *testing.T, src string) *balancer.ClientsConfig {
	t.Helper()
	cfg, err := LoadProperties(strings.NewReader(src))
	if err != nil {
		t.Fatalf("LoadProperties: %v", err)
	}
	return cfg
}

// The file of the brief, end to end: load it, build the balancer, and check
// that it keeps to zone local and trips breakers as the file says.
func TestPropertiesServiceProviderEndToEnd(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "testdata", "ribbon", "service-provider.properties"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := LoadProperties(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.IgnoredKeys) != 0 {
		t.Errorf("IgnoredKeys = %v, want none", cfg.IgnoredKeys)
	}
	if cfg.Defaults.Zone != "local" {
		t.Errorf("defaults zone = %q, want local", cfg.Defaults.Zone)
	}
	c := cfg.For("service-provider")
	want := balancer.DefaultConfig()
	want.Zone = "local"
	want.Rule = balancer.RuleAvailabilityFiltering
	want.Filter = balancer.FilterZoneAffinity
	want.ZoneAffinity.Enabled = true
	want.ZoneAffinity.Exclusive = true
	want.Breaker = balancer.BreakerConfig{Threshold: 3, Factor: 10 * time.Second, Max: 30 * time.Second}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("service-provider config:\n got %+v\nwant %+v", c, want)
	}

	clock := &fakeClock{t: time.Unix(1000, 0)}
	f2, err := balancer.NewFactory(cfg, balancer.WithBalancerOptions(balancer.WithClock(clock)))
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	b, err := f2.Get("service-provider")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetServers([]balancer.Server{
		{ID: "local-1", Host: "10.0.0.1", Port: 8080, Zone: "local"},
		{ID: "local-2", Host: "10.0.0.2", Port: 8080, Zone: "local"},
		{ID: "remote-1", Host: "10.1.0.1", Port: 8080, Zone: "remote"},
		{ID: "remote-2", Host: "10.1.0.2", Port: 8080, Zone: "remote"},
		{ID: "remote-3", Host: "10.1.0.3", Port: 8080, Zone: "remote"},
	}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	counts := map[string]int{}
	for range 1000 {
		s, err := b.Choose(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Zone != "local" {
			t.Fatalf("picked %s in zone %q: exclusivity keeps to zone local", s.ID, s.Zone)
		}
		counts[s.ID]++
	}
	if counts["local-1"] != 500 || counts["local-2"] != 500 {
		t.Errorf("round robin over zone local: %v, want 500 each", counts)
	}

	// 3 successive connection failures trip local-1 for 10 s: the
	// availability filter skips it, and exclusivity still keeps to zone
	// local even under load or failures.
	for range 3 {
		b.Begin(b.Server("local-1")).Done(balancer.DoneInfo{ConnectFailure: true})
	}
	for i := range 1000 {
		s, err := b.Choose(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.ID != "local-2" {
			t.Fatalf("pick %d: %s, want local-2 while local-1 is tripped", i, s.ID)
		}
	}
	if got := c.Breaker.Blackout(3); got != 10*time.Second {
		t.Errorf("blackout after 3 failures = %v, want 10s", got)
	}
	if got := c.Breaker.Blackout(5); got != 30*time.Second {
		t.Errorf("blackout after 5 failures = %v, want the 30s max", got)
	}
	clock.Advance(10*time.Second + time.Millisecond)
	seen := map[string]bool{}
	for range 10 {
		s, err := b.Choose(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Zone != "local" {
			t.Fatalf("picked %s in zone %q", s.ID, s.Zone)
		}
		seen[s.ID] = true
	}
	if !seen["local-1"] {
		t.Error("local-1 not picked again after its 10 s blackout")
	}
}

func TestPropertiesSyntax(t *testing.T) {
	src := "# comment\n" +
		"   ! another comment \\\n" + // a comment line is not continued
		"\n" +
		"  \t\n" +
		"plain=value\n" +
		"colon: value 2\n" +
		"space   value 3\n" +
		"spaced = value 4  \n" +
		"ws\t: value 5\n" +
		"empty\n" +
		"empty2=\n" +
		"key\\ with\\ spaces = v\n" +
		"key\\=with\\:seps=v\n" +
		"unicode=z\\u00F6ne \\u20AC \\uD83D\\uDE00\n" +
		"escapes=a\\tb\\nc\\\\d\\e\n" +
		"list=a,\\\n" +
		"     b, \\\n" +
		"\t   c\n" +
		"notcomment=x\\\n" +
		"  # still the value\n" +
		"two.backslashes=x\\\\\n" +
		"after=y\r\n" +
		"crlf=1\r\n" +
		"cr=2\rlast=3\\"
	props, err := readProperties([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range props {
		got[p.key] = p.value
	}
	want := map[string]string{
		"plain":           "value",
		"colon":           "value 2",
		"space":           "value 3",
		"spaced":          "value 4  ",
		"ws":              "value 5",
		"empty":           "",
		"empty2":          "",
		"key with spaces": "v",
		"key=with:seps":   "v",
		"unicode":         "zöne € 😀",
		"escapes":         "a\tb\nc\\de",
		"list":            "a,b, c",
		"notcomment":      "x# still the value",
		"two.backslashes": `x\`,
		"after":           "y",
		"crlf":            "1",
		"cr":              "2",
		"last":            "3",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parsed:\n%q\nwant\n%q", got, want)
	}
	lines := map[string]int{}
	for _, p := range props {
		lines[p.key] = p.line
	}
	if lines["plain"] != 5 || lines["list"] != 16 || lines["notcomment"] != 19 {
		t.Errorf("line numbers: %v", lines)
	}
}

func TestPropertiesLatin1AndDuplicates(t *testing.T) {
	props, err := readProperties([]byte("a=z\xf6ne\nb=1\na=2\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []property{{key: "b", value: "1", line: 2}, {key: "a", value: "2", line: 3}}
	if !reflect.DeepEqual(props, want) {
		t.Errorf("got %+v, want %+v (later duplicates win)", props, want)
	}
	cfg := loadProps(t, "@zone=z\xf6ne\n")
	if cfg.Defaults.Zone != "zöne" {
		t.Errorf("ISO-8859-1 zone = %q", cfg.Defaults.Zone)
	}
}

func TestPropertiesLineContinuationInRibbonKeys(t *testing.T) {
	cfg := loadProps(t, `
orders.ribbon.listOfServers=127.0.0.1:9001,\
                            127.0.0.1:9002, \
                            https://127.0.0.1:9003
orders.ribbon.NFLoadBalancerRuleClassName = \
    com.netflix.loadbalancer.RandomRule
`)
	o := cfg.For("orders")
	if want := []string{"127.0.0.1:9001", "127.0.0.1:9002", "https://127.0.0.1:9003"}; !reflect.DeepEqual(o.ListOfServers, want) {
		t.Errorf("listOfServers = %q, want %q", o.ListOfServers, want)
	}
	if o.Rule != balancer.RuleRandom {
		t.Errorf("rule = %q", o.Rule)
	}
}

func TestPropertiesClientWinsOverGlobal(t *testing.T) {
	// The client's settings come first in the file: they still win.
	cfg := loadProps(t, `
orders.ribbon.ConnectTimeout=250
orders.ribbon.NFLoadBalancerRuleClassName=com.netflix.loadbalancer.RoundRobinRule
niws.loadbalancer.orders.connectionFailureCountThreshold=7
ribbon.ConnectTimeout=3000
ribbon.ReadTimeout=5000
ribbon.NFLoadBalancerRuleClassName=com.netflix.loadbalancer.BestAvailableRule
niws.loadbalancer.default.connectionFailureCountThreshold=4
niws.loadbalancer.default.circuitTripMaxTimeoutSeconds=60
`)
	o := cfg.For("orders")
	if o.ConnectTimeout != 250*time.Millisecond || o.Rule != balancer.RuleRoundRobin || o.Breaker.Threshold != 7 {
		t.Errorf("orders: connect %v rule %q threshold %d: the client's own settings must win",
			o.ConnectTimeout, o.Rule, o.Breaker.Threshold)
	}
	if o.ReadTimeout != 5*time.Second || o.Breaker.Max != 60*time.Second {
		t.Errorf("orders: read %v max %v: unset keys come from the globals", o.ReadTimeout, o.Breaker.Max)
	}
	d := cfg.For("other")
	if d.ConnectTimeout != 3*time.Second || d.Rule != balancer.RuleBestAvailable || d.Breaker.Threshold != 4 {
		t.Errorf("defaults: %+v", d)
	}
}

func TestPropertiesAllKeys(t *testing.T) {
	cfg := loadProps(t, `
spring.application.name=gateway
server.port=8080
spring.cloud.loadbalancer.ribbon.enabled=false
eureka.client.serviceUrl.defaultZone=http://eureka:8761/eureka/
eureka.instance.metadata-map.zone=meta-zone
archaius.deployment.zone=deploy-zone
ribbon.eager-load.enabled=true
ribbon.ZoneAwareNIWSDiscoveryLoadBalancer.enabled=false
ZoneAwareNIWSDiscoveryLoadBalancer.triggeringLoadPerServerThreshold=0.3
niws.loadbalancer.serverStats.activeRequestsCount.effectiveWindowSeconds=120
niws.loadbalancer.availabilityFilteringRule.activeConnectionsLimit=50
niws.loadbalancer.availabilityFilteringRule.filterCircuitTripped=true
a.ribbon.nfloadbalancerruleclassname=com.netflix.loadbalancer.WeightedResponseTimeRule
a.ribbon.NIWSServerListFilterClassName=org.springframework.cloud.netflix.ribbon.ZonePreferenceServerListFilter
a.ribbon.NFLoadBalancerPingClassName=com.netflix.loadbalancer.PingUrl
a.ribbon.NFLoadBalancerPingInterval=15
a.ribbon.ServerListRefreshInterval=2000
a.ribbon.listOfServers=host-a, https://host-b, host-c:81
a.ribbon.EnableZoneAffinity=TRUE
a.ribbon.EnableZoneExclusivity=no
a.ribbon.zoneAffinity.maxLoadPerServer=0.9
a.ribbon.zoneAffinity.maxBlackOutServesrPercentage=0.5
a.ribbon.zoneAffinity.minAvailableServers=3
a.ribbon.ConnectTimeout=100
a.ribbon.ReadTimeout=200
a.ribbon.MaxAutoRetries=1
a.ribbon.MaxAutoRetriesNextServer=2
a.ribbon.OkToRetryOnAllOperations=true
a.ribbon.ActiveConnectionsLimit=-1
a.ribbon.NIWSServerListClassName=com.netflix.niws.loadbalancer.DiscoveryEnabledNIWSServerList
a.ribbon.DeploymentContextBasedVipAddresses=a
ZoneAwareNIWSDiscoveryLoadBalancer.a.enabled=true
ZoneAwareNIWSDiscoveryLoadBalancer.a.avoidZoneWithBlackoutPercetage=0.7
niws.loadbalancer.a.circuitTripTimeoutFactorSeconds=5
niws.loadbalancer.a.circuitTripMaxTimeoutSeconds=20
b.ribbon.zoneAffinity.maxBlackOutServesrsPercentage=0.4
b.ribbon.ZoneAwareNIWSDiscoveryLoadBalancer.triggeringLoadPerServerThreshold=0.5
b.ribbon.ZoneAwareNIWSDiscoveryLoadBalancer.avoidZoneWithBlackoutPercentage=0.6
b.ribbon.NFLoadBalancerPingClassName=com.netflix.niws.loadbalancer.NIWSDiscoveryPing
b.ribbon.ActiveConnectionsLimit=10
c.ribbon.zoneAffinity.maxBlackoutServersPercentage=0.3
c.ribbon.PoolMaxThreadsPerRoute=10
`)
	d := cfg.Defaults
	if d.Zone != "deploy-zone" {
		t.Errorf("zone = %q: the deployment context wins over Eureka's metadata", d.Zone)
	}
	if d.ZoneAware || d.ZoneAvoidance.TriggeringLoadPerServer != 0.3 ||
		d.ActiveRequestsTimeout != 120*time.Second || d.ActiveConnectionsLimit != 50 {
		t.Errorf("defaults = %+v", d)
	}

	a := cfg.For("a")
	want := d
	want.Rule = balancer.RuleWeightedResponseTime
	want.Filter = balancer.FilterZonePreference
	want.Ping.Kind, want.Ping.Path, want.Ping.Interval = balancer.PingHTTP, "/", 15*time.Second
	want.ServerListRefreshInterval = 2 * time.Second
	want.ListOfServers = []string{"host-a:80", "https://host-b:443", "host-c:81"}
	want.ZoneAffinity = balancer.ZoneAffinityConfig{Enabled: true, MaxLoadPerServer: 0.9, MaxBlackoutPercentage: 0.5, MinAvailableServers: 3}
	want.ConnectTimeout, want.ReadTimeout = 100*time.Millisecond, 200*time.Millisecond
	want.MaxAutoRetries, want.MaxAutoRetriesNextServer, want.RetryAllOperations = 1, 2, true
	want.ActiveConnectionsLimit = 0 // -1: no limit
	want.ZoneAware = true
	want.ZoneAvoidance.BlackoutPercentage = 0.7
	want.Breaker.Factor, want.Breaker.Max = 5*time.Second, 20*time.Second
	if !reflect.DeepEqual(a, want) {
		t.Errorf("a:\n got %+v\nwant %+v", a, want)
	}

	b := cfg.For("b")
	if b.ZoneAffinity.MaxBlackoutPercentage != 0.4 || b.ZoneAvoidance.TriggeringLoadPerServer != 0.5 ||
		b.ZoneAvoidance.BlackoutPercentage != 0.6 || b.Ping.Kind != balancer.PingNone || b.ActiveConnectionsLimit != 10 {
		t.Errorf("b = %+v", b)
	}
	if c := cfg.For("c"); c.ZoneAffinity.MaxBlackoutPercentage != 0.3 {
		t.Errorf("c = %+v", c.ZoneAffinity)
	}

	wantIgnored := []string{
		"ribbon.eager-load.enabled",
		"niws.loadbalancer.availabilityFilteringRule.filterCircuitTripped",
		"a.ribbon.NIWSServerListClassName",
		"a.ribbon.DeploymentContextBasedVipAddresses",
		"c.ribbon.PoolMaxThreadsPerRoute",
	}
	if !reflect.DeepEqual(cfg.IgnoredKeys, wantIgnored) {
		t.Errorf("IgnoredKeys = %q\nwant %q", cfg.IgnoredKeys, wantIgnored)
	}
	if got := cfg.Names(); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Errorf("Names = %v (non-Ribbon keys must not make clients)", got)
	}
	for _, name := range cfg.Names() {
		b, err := balancer.New(name, cfg.For(name))
		if err != nil {
			t.Errorf("New(%s): %v", name, err)
			continue
		}
		b.Close()
	}
}

func TestPropertiesZonePrecedence(t *testing.T) {
	tests := []struct{ src, want string }{
		{"eureka.instance.metadata-map.zone=m\n", "m"},
		{"eureka.instance.metadataMap.zone=m\n", "m"},
		{"@zone=d\neureka.instance.metadata-map.zone=m\n", "d"},
		{"eureka.instance.metadata-map.zone=m\n@zone=d\n", "d"},
		{"eureka.instance.metadata-map.zone=m\narchaius.deployment.zone=\n", "m"},
		{"spring.profiles.active=x\n", ""},
	}
	for _, tt := range tests {
		if got := loadProps(t, tt.src).Defaults.Zone; got != tt.want {
			t.Errorf("%q: zone %q, want %q", tt.src, got, tt.want)
		}
	}
}

func TestPropertiesErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"unknown rule class", "x.ribbon.NFLoadBalancerRuleClassName=com.example.FastestRule\n",
			[]string{"x.ribbon.NFLoadBalancerRuleClassName", `"com.example.FastestRule"`, "unknown rule", "line 1"}},
		{"unknown filter class", "ribbon.NIWSServerListFilterClassName=com.netflix.loadbalancer.ServerListSubsetFilter\n",
			[]string{"ribbon.NIWSServerListFilterClassName", "ServerListSubsetFilter"}},
		{"unknown ping class", "x.ribbon.NFLoadBalancerPingClassName=com.netflix.loadbalancer.PingConstant\n",
			[]string{"x.ribbon.NFLoadBalancerPingClassName", "PingConstant"}},
		{"not a number", "\nx.ribbon.ConnectTimeout=abc\n",
			[]string{"x.ribbon.ConnectTimeout", `"abc"`, "milliseconds", "line 2"}},
		{"not a whole number", "x.ribbon.MaxAutoRetries=1.5\n", []string{"x.ribbon.MaxAutoRetries", `"1.5"`}},
		{"negative", "x.ribbon.MaxAutoRetries=-2\n", []string{"x.ribbon.MaxAutoRetries", `"-2"`, "negative"}},
		{"not a float", "x.ribbon.zoneAffinity.maxLoadPerServer=lots\n", []string{"zoneAffinity.maxLoadPerServer", `"lots"`}},
		{"not a boolean", "x.ribbon.EnableZoneAffinity=maybe\n", []string{"x.ribbon.EnableZoneAffinity", `"maybe"`, "boolean"}},
		{"breaker not a number", "niws.loadbalancer.x.connectionFailureCountThreshold=three\n",
			[]string{"niws.loadbalancer.x.connectionFailureCountThreshold", `"three"`}},
		{"bad server", "x.ribbon.listOfServers=a:1,b:notaport\n", []string{"x.ribbon.listOfServers", "notaport"}},
		{"typo in a client key", "x.ribbon.EnableZoneAfinity=true\n",
			[]string{"x.ribbon.EnableZoneAfinity", `"EnableZoneAfinity"`, `did you mean "EnableZoneAffinity"`}},
		{"typo in a global key", "ribbon.ConectTimeout=1000\n", []string{"ribbon.ConectTimeout", `"ConnectTimeout"`}},
		{"breaker key in the wrong namespace", "x.ribbon.connectionFailureCountThreshold=3\n",
			[]string{"x.ribbon.connectionFailureCountThreshold", "niws.loadbalancer.<client>.connectionFailureCountThreshold"}},
		{"unknown niws key", "niws.loadbalancer.x.conectionFailureCountThreshold=3\n",
			[]string{"niws.loadbalancer.x.conectionFailureCountThreshold", `"connectionFailureCountThreshold"`}},
		{"niws key without client", "niws.loadbalancer.threshold=3\n", []string{"niws.loadbalancer.threshold"}},
		{"unknown zone-aware key", "ZoneAwareNIWSDiscoveryLoadBalancer.x.triggeringLoad=0.1\n",
			[]string{"ZoneAwareNIWSDiscoveryLoadBalancer.x.triggeringLoad", "triggeringLoadPerServerThreshold"}},
		{"malformed unicode escape", "x.ribbon.ConnectTimeout=\\u12G4\n", []string{"line 1", "x.ribbon.ConnectTimeout", `\u12G4`}},
		{"short unicode escape", "@zone=a\\u12\n", []string{"line 1", `\uXXXX`}},
		{"zero duration", "x.ribbon.ServerListRefreshInterval=0\n",
			[]string{"x.ribbon.ServerListRefreshInterval", `"0"`, "positive"}},
		{"zero threshold", "niws.loadbalancer.default.connectionFailureCountThreshold=0\n",
			[]string{"niws.loadbalancer.default.connectionFailureCountThreshold", "at least 1"}},
		{"validation names the client", "x.ribbon.zoneAffinity.maxBlackOutServesrPercentage=1.5\n",
			[]string{`client "x"`, "zoneAffinity.maxBlackoutPercentage"}},
		{"validation of the defaults", "ribbon.zoneAffinity.maxBlackOutServesrPercentage=-1\n",
			[]string{"defaults", "zoneAffinity.maxBlackoutPercentage"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := LoadProperties(strings.NewReader(tt.src))
			if err == nil {
				t.Fatalf("no error; got %+v", cfg)
			}
			if !errors.Is(err, balancer.ErrInvalidConfig) {
				t.Errorf("error %v does not wrap balancer.ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
		})
	}
}

func TestPropertiesReportsEveryError(t *testing.T) {
	_, err := LoadProperties(strings.NewReader("a.ribbon.ConnectTimeout=x\nb.ribbon.Bogus=1\n"))
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	i, j := strings.Index(msg, "a.ribbon.ConnectTimeout"), strings.Index(msg, "b.ribbon.Bogus")
	if i < 0 || j < 0 || i > j {
		t.Errorf("error %q should report both keys, in file order", msg)
	}
}

func TestPropertiesDefaultPort(t *testing.T) {
	tests := map[string]string{
		"host":              "host:80",
		"host/":             "host:80",
		"http://host":       "http://host:80",
		"https://host":      "https://host:443",
		"HTTPS://host/":     "HTTPS://host:443",
		"host:81":           "host:81",
		"[::1]":             "[::1]:80",
		"[::1]:81":          "[::1]:81",
		"https://[::1]:444": "https://[::1]:444",
		"::1":               "::1",
	}
	for in, want := range tests {
		if got := withDefaultPort(in); got != want {
			t.Errorf("withDefaultPort(%q) = %q, want %q", in, got, want)
		}
	}
}
