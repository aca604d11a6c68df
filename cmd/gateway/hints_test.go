package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestHintsSteerRequests runs the gateway binary with a YAML file that sets
// a zone hint header for the default rule and a keyed route, over four
// announced backends of one service in two zones whose rule is Rendezvous:
//
//   - X-Zone: a (any case) reaches only a1 and a2, X-Zone: b only b1 and b2;
//   - on the keyed route, a key (X-User) always reaches the same backend,
//     and twenty keys spread over several;
//   - the route inherits the zone header: a key with X-Zone: b stays in b.
func TestHintsSteerRequests(t *testing.T) {
	g := startConfigured(t, `
hints: {zoneHeader: X-Zone}
routes:
  - {prefix: /sticky, service: orders, stripPrefix: true, hashKey: {header: X-User}}
balancer:
  clients:
    orders: {rule: Rendezvous}
`)

	zoneOf := map[string]string{"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
	for _, name := range []string{"a1", "a2", "b1", "b2"} {
		b := named(t, name)
		announceHold(t, g, "orders", b.Listener.Addr().String(), "-zone", zoneOf[name])
	}
	testutil.Eventually(t, "four backends listed", func() bool { return strings.Count(g.state(t), `"id"`) == 4 })

	get := func(path string, header ...string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+g.proxy+path, nil)
		for i := 0; i < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		code, body, err := testutil.Do(client, req)
		if err != nil || code != 200 {
			t.Fatalf("GET %s %v: %d %q %v", path, header, code, body, err)
		}
		return body
	}

	for _, zone := range []string{"a", "B"} {
		seen := map[string]int{}
		for range 40 {
			seen[get("/orders/x", "X-Zone", zone)]++
		}
		for name := range seen {
			if !strings.EqualFold(zoneOf[name], zone) {
				t.Fatalf("X-Zone: %s reached %v", zone, seen)
			}
		}
		if len(seen) != 2 { // Rendezvous without a key is round robin
			t.Fatalf("X-Zone: %s reached %v, want both of its backends", zone, seen)
		}
	}

	first := map[string]string{}
	for round := range 3 {
		for i := range 20 {
			user := fmt.Sprintf("user-%d", i)
			got := get("/sticky/cart", "X-User", user)
			if prev, ok := first[user]; ok && got != prev {
				t.Fatalf("round %d: %s reached %s, before %s", round, user, got, prev)
			}
			first[user] = got
		}
	}
	spread := map[string]int{}
	for _, name := range first {
		spread[name]++
	}
	if len(spread) < 2 {
		t.Fatalf("20 keys all reached %v", spread)
	}
	t.Logf("20 keys over the backends: %v", spread)

	for i := range 20 {
		user := fmt.Sprintf("user-%d", i)
		if got := get("/sticky/cart", "X-User", user, "X-Zone", "b"); zoneOf[got] != "b" {
			t.Fatalf("%s with X-Zone: b reached %s", user, got)
		}
	}
}
