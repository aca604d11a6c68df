package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestOutlierEjectionThroughTheGateway runs the gateway binary with
// outlier detection in its YAML over two backends announced by announce
// processes, one of which answers every request with a 500: after exactly
// three 500s in a row it is ejected, every later request reaches the good
// backend, and /metrics and /-/lb say so.
func TestOutlierEjectionThroughTheGateway(t *testing.T) {
	g := startConfigured(t, `
balancer:
  clients:
    orders:
      rule: RoundRobin
      maxAutoRetriesNextServer: 0
      outlierDetection: {consecutive5xx: 3, baseEjectionTime: 1h, maxEjectionTime: 1h, maxEjectionPercent: 50}
`)

	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "broken", http.StatusInternalServerError)
	}))
	t.Cleanup(bad.Close)
	good := named(t, "good")
	for _, b := range []*httptest.Server{bad, good} {
		announceHold(t, g, "orders", b.Listener.Addr().String())
	}
	testutil.Eventually(t, "two backends listed", func() bool { return strings.Count(g.state(t), `"id"`) == 2 })

	errors := 0
	for i := range 60 {
		code, body, err := testutil.Fetch(client, "http://"+g.proxy+"/orders/x")
		switch {
		case err != nil:
			t.Fatalf("request %d: %v", i, err)
		case code == http.StatusInternalServerError:
			errors++
		case strings.TrimSpace(body) != "good":
			t.Fatalf("request %d: %d %q", i, code, body)
		}
	}
	if errors != 3 {
		t.Fatalf("%d of 60 requests met the broken backend, want 3: it should be ejected after 3 in a row", errors)
	}
	if got := g.metric(`pushlb_servers_ejected{service="orders"}`); got != 1 {
		t.Fatalf("pushlb_servers_ejected = %v, want 1", got)
	}
	if got := g.metric(`pushlb_outlier_ejections_total{service="orders"}`); got != 1 {
		t.Fatalf("pushlb_outlier_ejections_total = %v, want 1", got)
	}
	if st := g.state(t); !strings.Contains(st, `"status": "ejected"`) {
		t.Fatalf("/-/lb does not show the ejected backend: %s", st)
	}
}
