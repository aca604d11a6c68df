package lbhttp

import (
	"sync/atomic"
)

// RetryBudget bounds the retries of one service, as Envoy's retry budgets
// do (retry_budget: budget_percent, min_retry_concurrency), so that a
// failing service is not hit by a retry storm: a retry may start while the
// retries in flight, this one included, stay within Percent of the
// service's requests in flight, or within MinConcurrent whatever the load
// (so that a quiet service, one request at a time, can still retry).
//
// A retry after a connection failure is always allowed, and counted in
// flight: nothing reached the server, so it adds no load to a failing
// service, and the circuit breaker already bounds how often a dead server
// is tried; this is what keeps a rolling restart, and the requests that
// start around a crash, free of failures. The budget limits the retries
// that do load the service: after a timeout, a reset, or a retryable
// status.
//
// A reset is counted even when its server crashed, which the Transport
// cannot tell from a server that failed under load when the reset comes:
// the requests in flight on a server that is killed each get one, all at
// once. A service with few instances and many concurrent requests (more
// in flight on one instance than Percent of the service's, and more than
// MinConcurrent) then fails the requests beyond the budget around a
// crash, as Envoy's budget would. Raise MinConcurrent to about what one
// instance has in flight for such a service, or disable the budget when a
// retry storm cannot overload it.
//
// A retry the budget refuses is not made: the request fails with what its
// last attempt got (the error says the budget is spent), and the refusal
// is counted (Observer.OnRetryDenied; the gateway's
// pushlb_retries_denied_total).
type RetryBudget struct {
	// Percent of the service's requests in flight that may be retries in
	// flight. Default 20 (Envoy's budget_percent).
	Percent float64 `yaml:"percent"`
	// MinConcurrent retries may be in flight whatever the load. Default 3
	// (Envoy's min_retry_concurrency).
	MinConcurrent int `yaml:"minConcurrent"`
	// Disabled turns the budget off: every retry the retry policy allows
	// is made.
	Disabled bool `yaml:"disabled"`
}

// DefaultRetryBudget is the budget of a Transport built without
// WithRetryBudget.
var DefaultRetryBudget = RetryBudget{Percent: 20, MinConcurrent: 3}

// Validate reports a budget's invalid setting.
func (b RetryBudget) Validate() error {
	switch {
	case b.Disabled:
		return nil
	case b.Percent < 0 || b.Percent > 100:
		return optionError("retry budget: percent %v must be within 0 and 100", b.Percent)
	case b.MinConcurrent < 0:
		return optionError("retry budget: minConcurrent %d must not be negative", b.MinConcurrent)
	}
	return nil
}

// WithRetryBudget sets the retry budget of every service (see RetryBudget).
func WithRetryBudget(b RetryBudget) Option {
	return func(t *Transport) error {
		if err := b.Validate(); err != nil {
			return err
		}
		t.budget = b
		return nil
	}
}

// retryBudget is one service's budget: its requests and retries in flight.
type retryBudget struct {
	cfg     RetryBudget
	active  atomic.Int64 // requests in flight (in RoundTrip)
	retries atomic.Int64 // retries in flight
}

func newRetryBudget(cfg RetryBudget) *retryBudget { return &retryBudget{cfg: cfg} }

// requestStarted and requestEnded count a request in flight.
func (b *retryBudget) requestStarted() { b.active.Add(1) }
func (b *retryBudget) requestEnded()   { b.active.Add(-1) }

// startRetry reports whether a retry may start, the one after a connection
// failure when connectFailure, and counts it in flight if so: retryEnded
// must follow.
func (b *retryBudget) startRetry(connectFailure bool) bool {
	n := b.retries.Add(1)
	if b.cfg.Disabled || connectFailure || n <= int64(b.cfg.MinConcurrent) ||
		float64(n) <= b.cfg.Percent/100*float64(b.active.Load()) {
		return true
	}
	b.retries.Add(-1)
	return false
}

func (b *retryBudget) retryEnded() { b.retries.Add(-1) }
