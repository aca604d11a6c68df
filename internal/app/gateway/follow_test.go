package gateway

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// metricValue returns the value of series in a /metrics text, -1 when it
// is absent.
func metricValue(text, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestGatewayFollowsRequestedServices: with follow: requested the gateway
// follows what it is asked for, and /metrics says so: the services
// followed, the follows by result, the applied registry revision per
// service and the apply lag of announcements.
func TestGatewayFollowsRequestedServices(t *testing.T) {
	cfg := testConfig(t)
	cfg.Follow = "" // the default: requested, as neither services nor demo is set
	g := startGateway(t, cfg)
	announce(t, g, "orders", "z1", testpub.Backend(t, "a"))
	announce(t, g, "billing", "z1", testpub.Backend(t, "b"))
	proxy, admin := "http://"+g.ProxyAddr(), "http://"+g.AdminAddr()

	if code, body := testutil.Get(t, proxy+"/orders/x"); code != http.StatusOK || body != "a /x" {
		t.Fatalf("first request for orders: %d %q", code, body)
	}
	if code, _ := testutil.Get(t, proxy+"/ghost/x"); code != http.StatusNotFound {
		t.Fatalf("a service nobody registered: %d, want 404", code)
	}
	if s := g.State().Services; len(s) != 1 || s[0].Name != "orders" {
		t.Fatalf("/-/lb services after a request for orders: %+v", s)
	}
	a2 := announce(t, g, "orders", "z1", testpub.Backend(t, "a2"))
	testutil.Eventually(t, "the second instance", func() bool { return len(g.State().Services[0].Servers) == 2 })
	// A withdrawal's offline event comes before its record's removal: the
	// change carries the event's time.
	if err := a2.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the withdrawal", func() bool { return len(g.State().Services[0].Servers) == 1 })

	_, metrics := testutil.Get(t, admin+"/metrics")
	for series, want := range map[string]float64{
		"pushlb_followed_services":                 1,
		`pushlb_follows_total{result="followed"}`:  1,
		`pushlb_follows_total{result="not_found"}`: 1,
		"pushlb_unfollows_total":                   0,
	} {
		if got := metricValue(metrics, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if got := metricValue(metrics, `pushlb_registry_revision{service="orders"}`); got < 1 {
		t.Errorf("pushlb_registry_revision of orders = %v", got)
	}
	if got := metricValue(metrics, `pushlb_list_apply_lag_seconds_count{cause="offline"}`); got < 1 {
		t.Errorf("no apply lag observed for the withdrawal (%v)", got)
	}
	if strings.Contains(metrics, `service="billing"`) {
		t.Error("/metrics has series of billing, which nothing requested")
	}
}

// TestFollowDefault: a gateway follows on request unless an extension
// serves every service (-xds: all), it is told what to route
// (subscriber.services: listed) or it runs the demo, whose page shows its
// backends before any request (all); follow: overrides them.
func TestFollowDefault(t *testing.T) {
	for _, c := range []struct {
		name       string
		cfg        func(*Config)
		wholeFleet bool
		want       pushlb.FollowMode
	}{
		{"nothing set", func(*Config) {}, false, pushlb.FollowRequested},
		{"services", func(c *Config) { c.Subscriber.Services = []string{"orders"} }, false, pushlb.FollowListed},
		{"demo", func(c *Config) { c.Demo = true }, false, pushlb.FollowAll},
		{"an extension of the whole fleet", func(c *Config) { c.Subscriber.Services = []string{"orders"} }, true, pushlb.FollowAll},
		{"follow all", func(c *Config) { c.Follow = pushlb.FollowAll; c.Subscriber.Services = []string{"orders"} }, false, pushlb.FollowAll},
		{"follow requested with demo", func(c *Config) { c.Follow = pushlb.FollowRequested; c.Demo = true }, false, pushlb.FollowRequested},
	} {
		cfg := DefaultConfig()
		c.cfg(&cfg)
		if got := cfg.follow(c.wholeFleet); got != c.want {
			t.Errorf("%s: follow() = %q, want %q", c.name, got, c.want)
		}
	}
}
