package lbhttp

import (
	"net/http"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestTrippedPreferredZoneFallsOver: the client's zone has one instance
// and it refuses connections (a crashed process whose record is still
// listed); zone b has two that answer. With the default rule and filter
// (ZoneAvoidance, ZonePreference) the breaker trips after its threshold of
// connect failures, and from then on requests go to zone b without trying
// the dead server first: it is tried at most threshold times in 500
// requests (before the fix, once per request: 500). Real connections.
func TestTrippedPreferredZoneFallsOver(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Zone = "a"
	// A blackout longer than the test however loaded the machine: no probe
	// of the dead server falls within it.
	cfg.Breaker.Factor, cfg.Breaker.Max = time.Hour, time.Hour
	dead := refusing(t, "a1")
	dead.Zone = "a"
	b1, b2 := newBackend(t, "b1", nil), newBackend(t, "b2", nil)
	lb := newBalancer(t, "orders", cfg, []balancer.Server{dead, b1.server("b"), b2.server("b")})
	client := &http.Client{Transport: newTestTransport(t, BalancerMap{"orders": lb})}
	const requests = 500
	for i := range requests {
		code, _, err := testutil.Fetch(client, "http://orders/x")
		if err != nil || code != 200 {
			t.Fatalf("request %d: %d, %v", i, code, err)
		}
	}
	tried := lb.ServerStats("a1").Requests()
	t.Logf("the dead server of the preferred zone was tried %d times in %d requests", tried, requests)
	if threshold := int64(cfg.Breaker.Threshold); tried > threshold {
		t.Fatalf("the dead server was tried %d times in %d requests, want at most the breaker's threshold %d", tried, requests, threshold)
	}
	if got := b1.hits.Load() + b2.hits.Load(); got != requests {
		t.Fatalf("zone b answered %d of %d requests", got, requests)
	}
}
