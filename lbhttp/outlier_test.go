package lbhttp

import (
	"net/http"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestOutlierEjectsServerErrors: one of three backends answers every
// request with a 500. With outlier detection (5 in a row) it is ejected
// after exactly five 500s, whichever rule: RoundRobin, which ignores the
// breaker, too. Its answers are answers for the breaker, which stays
// closed. Real connections, streamed and bodiless answers both counted.
func TestOutlierEjectsServerErrors(t *testing.T) {
	for _, rule := range []string{balancer.RuleRoundRobin, balancer.RuleZoneAvoidance} {
		t.Run(rule, func(t *testing.T) {
			cfg := balancer.DefaultConfig()
			cfg.Rule = rule
			cfg.MaxAutoRetriesNextServer = 0 // the 500s reach the client
			cfg.OutlierDetection.Consecutive5xx = 5
			cfg.OutlierDetection.MaxEjectionPercent = 50
			cfg.OutlierDetection.BaseEjectionTime = time.Hour // not over within the test
			cfg.OutlierDetection.MaxEjectionTime = time.Hour
			bad := newBackend(t, "bad", func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "broken", http.StatusInternalServerError)
			})
			g1, g2 := newBackend(t, "g1", nil), newBackend(t, "g2", nil)
			lb := newBalancer(t, "orders", cfg, []balancer.Server{bad.server(""), g1.server(""), g2.server("")})
			client := &http.Client{Transport: newTestTransport(t, BalancerMap{"orders": lb})}
			const requests = 300
			errors := 0
			for i := range requests {
				code, _, err := testutil.Fetch(client, "http://orders/x")
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if code == http.StatusInternalServerError {
					errors++
				}
			}
			st := lb.ServerStats("bad")
			if errors != 5 || bad.hits.Load() != 5 || !st.Ejected() || lb.Ejections() != 1 {
				t.Fatalf("%d 500s, %d requests to the bad backend, ejected %v (%d ejections); want 5, 5, true, 1",
					errors, bad.hits.Load(), st.Ejected(), lb.Ejections())
			}
			if st.CircuitTripped() || st.SuccessiveFailures() != 0 {
				t.Fatal("500s tripped the breaker: they are answers")
			}
			if got := g1.hits.Load() + g2.hits.Load(); got != requests-5 {
				t.Fatalf("the good backends answered %d of %d", got, requests-5)
			}
		})
	}
}
