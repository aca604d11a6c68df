package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestSubsetsCanaryAndHints runs the gateway binary with a YAML file that
// splits a route 80/20 between version=v1 and version=v2 (sticky per
// X-User), and a strict route to version=v3, over three backends that
// announce their version with announce -meta:
//
//   - about 20 % of 1,000 keys reach v2 (the split hashes the key: no
//     randomness), and /metrics counts the requests per subset exactly;
//   - a key always reaches the same version;
//   - X-Pushlb-Hint: canary reaches the instance announced with
//     -meta hint=canary, an unknown hint every instance;
//   - the strict route answers 503 naming its selector.
func TestSubsetsCanaryAndHints(t *testing.T) {
	g := startConfigured(t, `
routes:
  - prefix: /canary
    service: orders
    stripPrefix: true
    hashKey: {header: X-User}
    split:
      - {subset: version=v1, weight: 80}
      - {subset: version=v2, weight: 20}
  - {prefix: /v3, service: orders, stripPrefix: true, subset: version=v3, fallback: none}
balancer:
  clients:
    orders: {rule: RoundRobin}
`)

	for name, meta := range map[string][]string{
		"v1-a": {"-meta", "version=v1"},
		"v1-b": {"-meta", "version=v1"},
		"v2-a": {"-meta", "version=v2", "-meta", "hint=canary"},
	} {
		b := named(t, name)
		announceHold(t, g, "orders", b.Listener.Addr().String(), meta...)
	}
	testutil.Eventually(t, "three backends listed", func() bool { return strings.Count(g.state(t), `"id"`) == 3 })

	get := func(path string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+g.proxy+path, nil)
		for i := 0; i < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		code, body, err := testutil.Do(client, req)
		if err != nil {
			t.Fatalf("GET %s %v: %v", path, header, err)
		}
		return code, strings.TrimSpace(body)
	}
	version := func(body string) string { v, _, _ := strings.Cut(body, "-"); return v }

	const n = 1000
	onV2 := 0
	for i := range n {
		code, body := get("/canary/x", "X-User", fmt.Sprintf("u%d", i))
		if code != 200 {
			t.Fatalf("/canary/x: %d %q", code, body)
		}
		if version(body) == "v2" {
			onV2++
		}
	}
	t.Logf("80/20 split: %d of %d keys on v2", onV2, n)
	if share := float64(onV2) / n * 100; share < 15 || share > 25 {
		t.Fatalf("v2 share %.1f %%, want 20 ± 5", share)
	}
	if got := g.metric(`pushlb_subset_requests_total{service="orders",subset="version=v2"}`); got != float64(onV2) {
		t.Fatalf("pushlb_subset_requests_total for v2: %v, want %d", got, onV2)
	}
	if got := g.metric(`pushlb_subset_requests_total{service="orders",subset="version=v1"}`); got != float64(n-onV2) {
		t.Fatalf("pushlb_subset_requests_total for v1: %v, want %d", got, n-onV2)
	}

	for i := range 30 {
		user := fmt.Sprintf("user-%d", i)
		_, first := get("/canary/x", "X-User", user)
		for range 3 {
			if _, body := get("/canary/x", "X-User", user); version(body) != version(first) {
				t.Fatalf("%s reached %s, then %s", user, first, body)
			}
		}
	}

	for range 20 {
		if _, body := get("/orders/x", "X-Pushlb-Hint", "canary"); body != "v2-a" {
			t.Fatalf("hint canary reached %q", body)
		}
	}
	seen := map[string]bool{}
	for range 30 {
		_, body := get("/orders/x", "X-Pushlb-Hint", "nobody")
		seen[body] = true
	}
	if len(seen) != 3 {
		t.Fatalf("an unknown hint reached %v, want every instance", seen)
	}

	if code, body := get("/v3/x"); code != http.StatusServiceUnavailable || body != "orders: no instance matches version=v3" {
		t.Fatalf("strict route without v3: %d %q", code, body)
	}
}
