package gateway

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// promQLWords are the PromQL functions, aggregations and keywords the
// dashboard may use; every other name outside label matchers, ranges and
// grouping clauses is a metric.
var promQLWords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "rate": true, "irate": true, "increase": true,
	"histogram_quantile": true, "by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "and": true, "or": true, "unless": true, "offset": true, "topk": true, "bottomk": true,
	"clamp_min": true, "clamp_max": true, "abs": true, "delta": true, "deriv": true, "label_values": true,
}

var (
	// Removed before names are read: string literals, label matchers,
	// ranges, grouping clauses.
	promQLNoise = regexp.MustCompile(`"[^"]*"|\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring)\s*\([^)]*\)`)
	promQLName  = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// Grafana's label_values(metric, label): the label is no metric.
	labelValues = regexp.MustCompile(`label_values\(\s*([^,)]+)(?:,[^)]*)?\)`)
)

// metricNames returns the metric names a PromQL expression reads.
func metricNames(expr string) []string {
	var names []string
	expr = labelValues.ReplaceAllString(expr, "$1")
	for _, n := range promQLName.FindAllString(promQLNoise.ReplaceAllString(expr, " "), -1) {
		if !promQLWords[n] {
			names = append(names, n)
		}
	}
	return names
}

// queries returns every "expr" and query string in the dashboard JSON.
func queries(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && (k == "expr" || (k == "query" && strings.Contains(s, "("))) {
				out = append(out, s)
			}
			out = append(out, queries(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, queries(e)...)
		}
	}
	return out
}

// Every query of examples/grafana/pushlb.json names metrics a running
// gateway exports, checked against its live /metrics with a service
// announced and a request served.
func TestGrafanaDashboardNamesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "grafana", "pushlb.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("pushlb.json: %v", err)
	}
	exprs := queries(dash)
	if len(exprs) < 10 {
		t.Fatalf("found %d queries, want the dashboard's", len(exprs))
	}

	g := startGateway(t, testConfig(t))
	announce(t, g, "orders", "z1", testpub.Backend(t, "a"))
	testutil.Eventually(t, "the server", func() bool { s := g.State().Services; return len(s) == 1 && len(s[0].Servers) == 1 })
	if code, _ := testutil.Get(t, "http://"+g.ProxyAddr()+"/orders/"); code != 200 {
		t.Fatalf("proxy answered %d", code)
	}
	_, body := testutil.Get(t, "http://"+g.AdminAddr()+"/metrics")
	exported := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		exported[promQLName.FindString(line)] = true
	}
	for _, expr := range exprs {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("no metric in %q", expr)
		}
		for _, n := range names {
			if !exported[n] {
				t.Errorf("%q reads %s, which the gateway does not export", expr, n)
			}
		}
	}
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string]string{
		`histogram_quantile(0.99, sum by (service, le) (rate(pushlb_upstream_duration_seconds_bucket{service=~"$service"}[$__rate_interval])))`: "pushlb_upstream_duration_seconds_bucket",
		`sum(rate(a_total[5m])) / sum without (kind) (b)`: "a_total,b",
		`label_values(pushlb_servers, service)`:           "pushlb_servers",
	} {
		if got := strings.Join(metricNames(expr), ","); got != want {
			t.Errorf("%s: %s, want %s", expr, got, want)
		}
	}
}
