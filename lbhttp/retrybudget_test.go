package lbhttp

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestRetryBudgetBoundsAStorm: 20 requests in flight all get a retryable
// 503 at once. The default budget lets max(3, 20 % of 20) = 4 retries
// into flight; the 16 others fail with their 503, counted as denied.
// Without the budget every one retries. Real backends; the first attempts
// and the retries are held at gates so that the counts are exact.
func TestRetryBudgetBoundsAStorm(t *testing.T) {
	for _, tc := range []struct {
		name    string
		budget  RetryBudget
		retries int
	}{
		{"default", DefaultRetryBudget, 4},
		{"disabled", RetryBudget{Disabled: true}, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const requests = 20
			gate1, gate2 := make(chan struct{}), make(chan struct{})
			var hits atomic.Int64
			h := func(w http.ResponseWriter, r *http.Request) {
				if hits.Add(1) <= requests {
					<-gate1
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				<-gate2
			}
			a, b := newBackend(t, "a", h), newBackend(t, "b", h)
			cfg := balancer.DefaultConfig()
			cfg.MaxAutoRetriesNextServer = 1
			lb := newBalancer(t, "orders", cfg, []balancer.Server{a.server(""), b.server("")})
			var denied atomic.Int64
			tr := newTestTransport(t, BalancerMap{"orders": lb}, WithRetryOnStatus(http.StatusServiceUnavailable),
				WithRetryBudget(tc.budget), WithObserver(Observer{OnRetryDenied: func(string) { denied.Add(1) }}))
			client := &http.Client{Transport: tr}
			var wg sync.WaitGroup
			var ok, unavailable atomic.Int64
			for range requests {
				wg.Go(func() {
					code, _, err := testutil.Fetch(client, "http://orders/")
					switch {
					case err != nil:
						t.Error(err)
					case code == http.StatusOK:
						ok.Add(1)
					case code == http.StatusServiceUnavailable:
						unavailable.Add(1)
					}
				})
			}
			testutil.Eventually(t, "every first attempt at the backends", func() bool { return hits.Load() == requests })
			close(gate1)
			testutil.Eventually(t, "the retries at the backends and the denied answered", func() bool {
				return hits.Load() == int64(requests+tc.retries) && unavailable.Load() == int64(requests-tc.retries)
			})
			close(gate2)
			wg.Wait()
			if ok.Load() != int64(tc.retries) || denied.Load() != int64(requests-tc.retries) || hits.Load() != int64(requests+tc.retries) {
				t.Fatalf("%d retried and answered 200, %d denied, %d requests at the backends; want %d, %d, %d",
					ok.Load(), denied.Load(), hits.Load(), tc.retries, requests-tc.retries, requests+tc.retries)
			}
		})
	}
}

// TestRetryBudgetAllowsConnectFailures: retries after connection failures
// are not bounded: 50 concurrent requests to a service whose first server
// refuses connections all succeed on the other.
func TestRetryBudgetAllowsConnectFailures(t *testing.T) {
	good := newBackend(t, "good", nil)
	cfg := balancer.DefaultConfig()
	cfg.Rule = balancer.RuleRoundRobin
	cfg.Breaker.Threshold = 1000 // the breaker would hide the retries
	lb := newBalancer(t, "orders", cfg, []balancer.Server{refusing(t, "dead"), good.server("")})
	client := &http.Client{Transport: newTestTransport(t, BalancerMap{"orders": lb})}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if code, _, err := testutil.Fetch(client, "http://orders/"); err != nil || code != http.StatusOK {
				t.Errorf("%d, %v", code, err)
			}
		})
	}
	wg.Wait()
}

func TestRetryBudgetValidation(t *testing.T) {
	for _, b := range []RetryBudget{{Percent: -1}, {Percent: 101}, {MinConcurrent: -1}} {
		if _, err := NewTransport(BalancerMap{}, WithRetryBudget(b)); err == nil {
			t.Errorf("%+v accepted", b)
		}
	}
}
