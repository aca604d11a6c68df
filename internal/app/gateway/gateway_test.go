package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	pushlb "github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/publisher"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// testConfig is the default configuration on free ports and a data
// directory of the test's, following every service: the tests read
// whole-fleet state (/-/lb, the dashboard, /metrics) before any request.
// TestGatewayFollowsRequestedServices runs the default (follow on request).
func testConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Follow = pushlb.FollowAll
	cfg.Listen, cfg.Admin, cfg.EmbeddedNATS = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	return cfg
}

func startGateway(t *testing.T, cfg Config) *Gateway {
	t.Helper()
	return startGatewayLogging(t, cfg, zerolog.Nop())
}

// startGatewayLogging is startGateway with the gateway's logs to log.
func startGatewayLogging(t *testing.T, cfg Config, log zerolog.Logger) *Gateway {
	t.Helper()
	g, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	return g
}

// announce publishes a backend as an instance of service through its own
// NATS connection, as cmd/announce would.
func announce(t *testing.T, g *Gateway, service, zone string, backend *httptest.Server) *publisher.Publisher {
	t.Helper()
	nc, err := nats.Connect(g.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return testpub.Announce(t, nc, service, zone, backend)
}

func TestGatewayRoutesToAnnouncedInstances(t *testing.T) {
	g := startGateway(t, testConfig(t))
	proxy := "http://" + g.ProxyAddr()
	if code, _ := testutil.Get(t, proxy+"/orders/x"); code != http.StatusNotFound {
		t.Fatalf("unknown service: %d, want 404", code)
	}
	a, b := testpub.Backend(t, "a"), testpub.Backend(t, "b")
	announce(t, g, "orders", "z1", a)
	pb := announce(t, g, "orders", "z1", b)
	seen := map[string]bool{}
	testutil.Eventually(t, "both backends to answer", func() bool {
		_, body := testutil.Get(t, proxy+"/orders/api/x")
		seen[body] = true
		return seen["a /api/x"] && seen["b /api/x"]
	})

	if err := pb.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b to leave", func() bool { return len(g.State().Services[0].Servers) == 1 })
	for range 20 {
		if _, body := testutil.Get(t, proxy+"/orders/y"); body != "a /y" {
			t.Fatalf("request reached %q after b withdrew", body)
		}
	}
}

func TestGatewayAdminEndpoints(t *testing.T) {
	g := startGateway(t, testConfig(t))
	announce(t, g, "orders", "z1", testpub.Backend(t, "a"))
	testutil.Eventually(t, "the server", func() bool { s := g.State().Services; return len(s) == 1 && len(s[0].Servers) == 1 })
	if code, _ := testutil.Get(t, "http://"+g.ProxyAddr()+"/orders/"); code != 200 {
		t.Fatalf("proxy answered %d", code)
	}
	admin := "http://" + g.AdminAddr()

	code, body := testutil.Get(t, admin+"/-/lb")
	if code != 200 || !strings.Contains(body, `"name": "orders"`) || !strings.Contains(body, `"zone": "z1"`) {
		t.Fatalf("/-/lb: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", admin+"/-/lb", nil)
	req.Header.Set("Accept", "text/html")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	html, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(html), `new EventSource("/-/lb/events")`) ||
		strings.Contains(string(html), `http-equiv="refresh"`) {
		t.Fatalf("HTML view: %s", html)
	}
	_, metrics := testutil.Get(t, admin+"/metrics")
	for _, m := range []string{"pushlb_events_received_total", `pushlb_events_dropped_total{reason="malformed"}`,
		"pushlb_event_propagation_lag_seconds_bucket", `pushlb_servers{service="orders"} 1`, `pushlb_picks_total{service="orders"} 1`,
		"pushlb_breaker_trips_total", `pushlb_lookups_total{result="hit"}`, "pushlb_registry_resyncs_total", "pushlb_retries_total"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if code, _ := testutil.Get(t, admin+"/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
}

// The admin root lists the endpoints (a person who opens the admin
// address finds /-/lb), as JSON or as links for a browser; another unknown
// path stays a 404.
func TestAdminRootListsTheEndpoints(t *testing.T) {
	g, err := New(testConfig(t), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	admin := httptest.NewServer(g.adminHandler())
	t.Cleanup(admin.Close)
	code, body := testutil.Get(t, admin.URL+"/")
	var index struct {
		Endpoints []struct{ Path, About string }
	}
	if err := json.Unmarshal([]byte(body), &index); code != 200 || err != nil {
		t.Fatalf("/: %d %v %s", code, err, body)
	}
	var paths []string
	for _, ep := range index.Endpoints {
		paths = append(paths, ep.Path)
	}
	for _, want := range []string{"/-/lb", "/metrics", "/healthz", "/readyz"} {
		if !slices.Contains(paths, want) {
			t.Errorf("/ lists %q, not %s", paths, want)
		}
	}
	req, _ := http.NewRequest("GET", admin.URL+"/", nil)
	req.Header.Set("Accept", "text/html")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(page), `<a href="/-/lb">`) {
		t.Errorf("/ for a browser: %s", page)
	}
	for _, path := range []string{"/nope", "/-/nope", "/index.html"} {
		if code, _ := testutil.Get(t, admin.URL+path); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, code)
		}
	}
}

func TestGatewayNoServersIs503(t *testing.T) {
	g := startGateway(t, testConfig(t))
	// Before any change, the timeline is an empty list, not null.
	if code, body := testutil.Get(t, "http://"+g.AdminAddr()+"/-/lb"); code != 200 || !strings.Contains(body, `"timeline": []`) {
		t.Fatalf("/-/lb of a new gateway: %d %s", code, body)
	}
	p := announce(t, g, "orders", "", testpub.Backend(t, "a"))
	testutil.Eventually(t, "the server", func() bool { s := g.State().Services; return len(s) == 1 && len(s[0].Servers) == 1 })
	p.Withdraw(t.Context(), "")
	testutil.Eventually(t, "an empty list", func() bool { return len(g.State().Services[0].Servers) == 0 })
	if code, body := testutil.Get(t, "http://"+g.ProxyAddr()+"/orders/x"); code != http.StatusServiceUnavailable || !strings.Contains(body, "orders") {
		t.Fatalf("%d %q", code, body)
	}
}

// freeRun returns the first of n consecutive ports free on 127.0.0.1 a
// moment ago, below the system's ephemeral range, from a random start so
// that parallel tests rarely meet.
func freeRun(t *testing.T, n int) int {
	t.Helper()
	for range 100 {
		base := 20000 + rand.IntN(10000)
		var lns []net.Listener
		for p := base; p < base+n; p++ {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if len(lns) == n {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// TestGatewayDemoPorts: -demo-port puts the demo backends on consecutive
// ports from it, so a newcomer on a shared machine keeps to a range.
func TestGatewayDemoPorts(t *testing.T) {
	cfg := testConfig(t)
	cfg.Demo = true
	cfg.DemoPort = freeRun(t, demoBackends)
	g := startGateway(t, cfg)
	var ports []int
	testutil.Eventually(t, "three demo backends listed", func() bool {
		ports = ports[:0]
		for _, svc := range g.State().Services {
			for _, s := range svc.Servers {
				_, p, _ := net.SplitHostPort(s.Addr)
				n, _ := strconv.Atoi(p)
				ports = append(ports, n)
			}
		}
		return len(ports) == demoBackends
	})
	slices.Sort(ports)
	if want := []int{cfg.DemoPort, cfg.DemoPort + 1, cfg.DemoPort + 2}; !slices.Equal(ports, want) {
		t.Fatalf("demo backends on ports %v, want %v", ports, want)
	}
	for _, bad := range []int{-1, 65534} {
		cfg.DemoPort = bad
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "demoPort") {
			t.Errorf("demoPort %d: %v, want a config error naming demoPort", bad, err)
		}
	}
}

func TestGatewayDemo(t *testing.T) {
	cfg := testConfig(t)
	cfg.Demo = true
	var logs testutil.SyncBuffer
	g := startGatewayLogging(t, cfg, zerolog.New(&logs))
	proxy, admin := "http://"+g.ProxyAddr(), "http://"+g.AdminAddr()
	seen := map[string]bool{}
	testutil.Eventually(t, "three demo backends", func() bool {
		// Until the client has the demo's list, the service is unknown (404).
		if code, body := testutil.Get(t, proxy+"/demo/"); code == 200 {
			seen[strings.Fields(body)[2]] = true
		}
		return len(seen) == 3
	})
	// A newcomer's first run shows no warning: up to the reaper's first
	// term (its leases, plain with the embedded server, said at info
	// level), the gateway logs no warning and no error.
	testutil.Eventually(t, "the reaper to lead and say its leases are plain", func() bool {
		return strings.Contains(logs.String(), "leases are plain, as configured")
	})
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
			t.Errorf("the demo's start logged: %s", line)
		}
		// Said in a user's terms, not by the option's Go name.
		if strings.Contains(line, "PlainLeases") {
			t.Errorf("the demo's start names an internal option: %s", line)
		}
	}
	resp, err := http.Post(admin+"/-/demo/stop/demo-2", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stop: %v %v", resp, err)
	}
	resp.Body.Close()
	for range 30 {
		if _, body := testutil.Get(t, proxy+"/demo/"); strings.Contains(body, "demo-2") {
			t.Fatalf("demo-2 answered after its stop: %s", body)
		}
	}
	if in := g.DemoInstructions(); !strings.Contains(in, "/-/demo/stop/demo-2") || !strings.Contains(in, "| sort | uniq -c") {
		t.Fatalf("instructions lack the stop command or the counts per backend:\n%s", in)
	}
}

func TestConfigFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	good := write("good.yaml", `
listen: 127.0.0.1:9000
zone: a
routes:
  - {prefix: /api/orders, service: orders, stripPrefix: true}
  - {prefix: /cart, service: cart, zoneHeader: X-Cart-Zone, hashKey: {cookie: SESSION}}
  - prefix: /canary
    service: orders
    hintHeader: X-Canary
    split: [{subset: version=v1, weight: 95}, {subset: version=v2, weight: 5}]
    fallback: default
    defaultSubset: version=v1
hints: {zoneHeader: X-Zone, hashKey: {clientIP: true}}
subscriber: {coalesce: 5ms}
balancer:
  clients:
    orders: {rule: RoundRobin}
`)
	cfg, err := LoadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9000" || cfg.Balancer.For("orders").Rule != "RoundRobin" || len(cfg.Routes) != 3 || cfg.Subscriber.Coalesce != 5*time.Millisecond {
		t.Fatalf("loaded %+v", cfg)
	}
	wantHints := lbhttp.Hints{ZoneHeader: "X-Cart-Zone", HashKey: lbhttp.HashKey{Cookie: "SESSION"}}
	if !reflect.DeepEqual(cfg.Routes[1].Hints, wantHints) || !reflect.DeepEqual(cfg.Hints, lbhttp.Hints{ZoneHeader: "X-Zone", HashKey: lbhttp.HashKey{ClientIP: true}}) {
		t.Fatalf("hints: route %+v, default %+v", cfg.Routes[1].Hints, cfg.Hints)
	}
	wantCanary := lbhttp.Hints{HintHeader: "X-Canary", Subsets: lbhttp.Subsets{
		Split:    []lbhttp.SplitShare{{Subset: "version=v1", Weight: 95}, {Subset: "version=v2", Weight: 5}},
		Fallback: "default", DefaultSubset: "version=v1",
	}}
	if !reflect.DeepEqual(cfg.Routes[2].Hints, wantCanary) {
		t.Fatalf("canary route: %+v", cfg.Routes[2].Hints)
	}
	if _, err := LoadFile(write("r.properties", "orders.ribbon.NFLoadBalancerRuleClassName=com.netflix.loadbalancer.RandomRule\n")); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"unknown.yaml":   "listn: x\n",
		"type.yaml":      "lease: forever\n",
		"route.yaml":     "routes: [{prefix: api, service: orders}]\n",
		"rule.yaml":      "balancer: {defaults: {rule: Fastest}}\n",
		"hints.yaml":     "hints: {hashKey: {header: X-User, cookie: S}}\n",
		"hintkey.yaml":   "hints: {hashKey: {session: S}}\n",
		"routehint.yaml": "routes: [{prefix: /a, service: a, zoneHeader: 'X Zone'}]\n",
		"split.yaml":     "routes: [{prefix: /a, service: a, split: [{subset: version=v1, weight: 1}, {subset: version, weight: 1}]}]\n",
		"fallback.yaml":  "routes: [{prefix: /a, service: a, subset: version=v2, fallback: nearest}]\n",
		"bad.properties": "orders.ribbon.NFLoadBalancerRuleClassName=com.example.Nope\n",
		"x.toml":         "",
	} {
		if _, err := LoadFile(write(name, body)); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: want ErrConfig, got %v", name, err)
		}
	}
	// Subset errors name the key at fault.
	for name, want := range map[string]string{
		"split.yaml":    `routes[0].split[1].subset: selector "version": want key=value`,
		"fallback.yaml": `routes[0].fallback: "nearest" is not one of any, default, none`,
	} {
		if _, err := LoadFile(filepath.Join(dir, name)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
}

// TestConfigDocExamples keeps docs/config.md honest: every YAML example in
// it is a gateway configuration that loads.
func TestConfigDocExamples(t *testing.T) {
	blocks := strings.Split(readConfigDoc(t), "```yaml\n")[1:]
	if len(blocks) < 2 {
		t.Fatalf("found %d YAML examples in docs/config.md, want at least 2", len(blocks))
	}
	for i, b := range blocks {
		example, _, ok := strings.Cut(b, "```")
		if !ok {
			t.Fatalf("unterminated yaml block: %.40q", b)
		}
		path := filepath.Join(t.TempDir(), "example.yaml")
		os.WriteFile(path, []byte(example), 0o600)
		if _, err := LoadFile(path); err != nil {
			t.Errorf("example %d does not load: %v\n%s", i+1, err, example)
		}
	}
}
