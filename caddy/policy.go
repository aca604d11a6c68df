package pushlbcaddy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"golang.org/x/net/http/httpguts"

	"github.com/pushlb/pushlb/balancer"
)

func init() {
	caddy.RegisterModule(new(Selection))
}

// Selection is the selection policy "pushlb"
// (http.reverse_proxy.selection_policies.pushlb): pushlb's rules, zone
// preference and circuit breaker choose the upstream.
//
// Over the upstreams of the pushlb source it picks with the service's
// balancer in the shared pushlb client: the service's rule (ZoneAvoidance
// by default, or what the source's rule or balancers_file sets), the
// source's zone preferred, the breaker of each instance. Over any other
// pool (static "to" upstreams, another dynamic source) it keeps a
// balancer of its own for the pool, with the policy's Rule.
//
// A request hint (the header HintHeader, default X-Pushlb-Hint) sends the
// request to the instances announced with metadata hint=<value>, as the
// gateway's hintHeader does: when none of them is alive, the request goes
// where it would have gone without the header (balancer.WithHint).
//
// Caddy's own judgement is kept: an upstream Caddy holds unavailable
// (passive health checks' max_fails, max_requests) is not chosen, and a
// retry does not go back to the upstream that just failed while another
// is available.
//
// The outcome of each attempt feeds pushlb's statistics: an attempt is
// active from the pick to the end of the request (or to Caddy's retry);
// one that got a response (any status) is a success, with the time to
// the response's headers as its response time; one that got none (Caddy
// retried it, or the request ended without an upstream response) counts
// as a connection failure towards the instance's breaker.
type Selection struct {
	// Rule is the pushlb rule for pools that do not come from the pushlb
	// source (RoundRobin, Random, BestAvailable, LeastRequest,
	// WeightedResponseTime, AvailabilityFiltering, ZoneAvoidance, Retry,
	// Maglev, Rendezvous). Default ZoneAvoidance. The pushlb source's
	// pools use their service's rule.
	Rule string `json:"rule,omitempty"`
	// HashHeader, HashCookie and HashQuery name where the request's key
	// for keyed rules (Maglev, Rendezvous) comes from: a header, a cookie
	// or a query parameter; the first one set is used. A request without
	// the key is picked as unkeyed.
	HashHeader string `json:"hash_header,omitempty"`
	HashCookie string `json:"hash_cookie,omitempty"`
	HashQuery  string `json:"hash_query,omitempty"`
	// HintHeader names the request header whose value is the request's
	// hint: the instances announced with metadata hint=<value> (-meta
	// hint=canary) take the request while one of them is alive, and
	// otherwise it goes where it would have gone without the header
	// (Spring Cloud LoadBalancer's X-SC-LB-Hint). A request without the
	// header, or with it empty, has no hint. Empty: DefaultHintHeader;
	// "-": no hint header.
	HintHeader string `json:"hint_header,omitempty"`

	hintHeader string // HintHeader as Provision resolved it: "" for none
	cfg        balancer.Config
	foreign    atomic.Pointer[foreignPool]
	mu         sync.Mutex // serialises rebuilds of foreign
}

// CaddyModule returns the Caddy module information.
func (*Selection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.pushlb",
		New: func() caddy.Module { return new(Selection) },
	}
}

// Provision checks the rule.
func (s *Selection) Provision(caddy.Context) error {
	s.cfg = balancer.DefaultConfig()
	if s.Rule != "" {
		s.cfg.Rule = s.Rule
	}
	if err := s.cfg.Validate(); err != nil {
		return fmt.Errorf("pushlb policy: rule %q: %w", s.Rule, err)
	}
	n := 0
	for _, k := range []string{s.HashHeader, s.HashCookie, s.HashQuery} {
		if k != "" {
			n++
		}
	}
	if n > 1 {
		return errors.New("pushlb policy: hash_header, hash_cookie and hash_query go alone: choose one key")
	}
	switch s.HintHeader {
	case "":
		s.hintHeader = DefaultHintHeader
	case noHintHeader:
		s.hintHeader = ""
	default:
		if !httpguts.ValidHeaderFieldName(s.HintHeader) {
			return fmt.Errorf("pushlb policy: hint_header %q is not a valid header name (%q: none)", s.HintHeader, noHintHeader)
		}
		s.hintHeader = s.HintHeader
	}
	return nil
}

// DefaultHintHeader is the request header the policy reads a request's
// hint from unless HintHeader names another: the gateway's
// (lbhttp.DefaultHintHeader).
const DefaultHintHeader = "X-Pushlb-Hint"

// noHintHeader is the HintHeader value that turns the hint header off.
const noHintHeader = "-"

// Validate checks the rule.
func (s *Selection) Validate() error {
	cfg := balancer.DefaultConfig()
	if s.Rule != "" {
		cfg.Rule = s.Rule
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("pushlb policy: rule %q: %w", s.Rule, err)
	}
	return nil
}

// Cleanup closes the balancer kept for other pools.
func (s *Selection) Cleanup() error {
	if f := s.foreign.Swap(nil); f != nil && f.b != nil {
		return f.b.Close()
	}
	return nil
}

// pickContext returns ctx with what r says to the balancer: its key for
// keyed rules, and its hint (Selection.hint's) when not empty.
func (s *Selection) pickContext(ctx context.Context, r *http.Request, hint string) context.Context {
	if key, ok := s.key(r); ok {
		ctx = balancer.WithKey(ctx, key)
	}
	if hint != "" {
		ctx = balancer.WithHint(ctx, hint)
	}
	return ctx
}

// hint returns the request's hint, "" for none.
func (s *Selection) hint(r *http.Request) string {
	if s.hintHeader == "" {
		return ""
	}
	return r.Header.Get(s.hintHeader)
}

// key returns the request's key for keyed rules.
func (s *Selection) key(r *http.Request) (string, bool) {
	switch {
	case s.HashHeader != "":
		v := r.Header.Get(s.HashHeader)
		return v, v != ""
	case s.HashCookie != "":
		c, err := r.Cookie(s.HashCookie)
		if err != nil || c.Value == "" {
			return "", false
		}
		return c.Value, true
	case s.HashQuery != "":
		v := r.URL.Query().Get(s.HashQuery)
		return v, v != ""
	}
	return "", false
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Selection)(nil)
	_ caddy.Validator       = (*Selection)(nil)
	_ caddy.CleanerUpper    = (*Selection)(nil)
	_ reverseproxy.Selector = (*Selection)(nil)
)
