package pushlbcaddy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

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

	cfg     balancer.Config
	foreign atomic.Pointer[foreignPool]
	mu      sync.Mutex // serialises rebuilds of foreign
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
	return nil
}

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

// maxPicks bounds the picks of one Select that Caddy's health or the
// previous attempt refuse, before the policy falls back to any available
// upstream.
const maxPicks = 3

// Select chooses an upstream of pool for r.
func (s *Selection) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	if len(pool) == 0 {
		return nil
	}
	var (
		b    picker
		ctx  context.Context
		byID map[string]int
	)
	if snap, ok := caddyhttp.GetVar(r.Context(), poolVar).(*poolSnapshot); ok && snap.hasBalancer && samePool(snap.upstreams, pool) {
		b, ctx, byID = snap.balancer, snap.source.zoneCtx, snap.byID
	} else {
		f := s.foreignFor(pool)
		if f == nil {
			return anyAvailable(pool, nil)
		}
		b, ctx, byID = f.b, context.Background(), f.byID
	}
	if key, ok := s.key(r); ok {
		ctx = balancer.WithKey(ctx, key)
	}
	a, _ := caddyhttp.GetVar(r.Context(), attemptVar).(*attempt)
	var previous *reverseproxy.Upstream
	if a != nil {
		previous = a.upstream
	}
	for range maxPicks {
		p, err := b.Pick(ctx)
		if err != nil {
			break
		}
		i, ok := byID[p.Server.ID]
		if !ok || i >= len(pool) || !pool[i].Available() || (pool[i] == previous && len(pool) > 1) {
			p.End() // never sent
			continue
		}
		track(r, a, p, pool[i])
		return pool[i]
	}
	// Caddy's health refuses what the rule offers, or the list moved
	// under the pick: any available upstream, as Caddy's random would.
	u := anyAvailable(pool, previous)
	if u != nil {
		track(r, a, balancer.Pick{}, u)
	}
	return u
}

// picker is the balancer a Select picks with: the service's view
// (pushlb.Balancer, one pointer: no allocation as an interface) or the
// policy's own balancer.
type picker interface {
	Pick(context.Context) (balancer.Pick, error)
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

// samePool reports whether pool is the snapshot's own slice.
func samePool(a, b []*reverseproxy.Upstream) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}

// anyAvailable returns an available upstream of pool other than avoid
// when there is one (avoid itself otherwise), by reservoir sampling as
// Caddy's random policy does; nil when none is available.
func anyAvailable(pool []*reverseproxy.Upstream, avoid *reverseproxy.Upstream) *reverseproxy.Upstream {
	var chosen *reverseproxy.Upstream
	n := 0
	for _, u := range pool {
		if u == avoid || !u.Available() {
			continue
		}
		n++
		if rand.IntN(n) == 0 {
			chosen = u
		}
	}
	if chosen == nil && avoid != nil && avoid.Available() {
		return avoid
	}
	return chosen
}

// foreignPool is the balancer the policy keeps for a pool that does not
// come from the pushlb source.
type foreignPool struct {
	first *reverseproxy.Upstream // identity of the pool: its first element and length
	n     int
	dials []string
	b     *balancer.Balancer
	byID  map[string]int
}

// foreignFor returns the balancer of pool, building or updating it when
// the pool changed; nil when the pool's addresses are not host:port
// (Unix sockets, placeholders).
func (s *Selection) foreignFor(pool []*reverseproxy.Upstream) *foreignPool {
	if f := s.foreign.Load(); f != nil && f.n == len(pool) && f.first == pool[0] {
		return f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.foreign.Load()
	if old != nil && old.n == len(pool) && old.first == pool[0] {
		return old
	}
	// Another pool value: the same addresses (a source that allocates its
	// upstreams per request) keep the balancer and its statistics.
	if old != nil && old.b != nil && sameDials(old.dials, pool) {
		f := &foreignPool{first: pool[0], n: len(pool), dials: old.dials, b: old.b, byID: old.byID}
		s.foreign.Store(f)
		return f
	}
	servers := make([]balancer.Server, 0, len(pool))
	dials := make([]string, len(pool))
	byID := make(map[string]int, len(pool))
	for i, u := range pool {
		dials[i] = u.Dial
		host, port, err := net.SplitHostPort(u.Dial)
		if err != nil {
			return nil
		}
		pn, err := strconv.Atoi(port)
		if err != nil || pn < 1 || pn > 65535 {
			return nil
		}
		if _, dup := byID[u.Dial]; dup {
			continue
		}
		byID[u.Dial] = i
		servers = append(servers, balancer.Server{ID: u.Dial, Host: host, Port: pn})
	}
	b := old.balancerOrNil()
	if b == nil {
		var err error
		if b, err = balancer.New("caddy", s.cfg); err != nil {
			return nil
		}
	}
	if err := b.SetServers(servers); err != nil && len(b.AllServers()) == 0 {
		return nil
	}
	f := &foreignPool{first: pool[0], n: len(pool), dials: dials, b: b, byID: byID}
	s.foreign.Store(f)
	return f
}

func (f *foreignPool) balancerOrNil() *balancer.Balancer {
	if f == nil {
		return nil
	}
	return f.b
}

func sameDials(dials []string, pool []*reverseproxy.Upstream) bool {
	if len(dials) != len(pool) {
		return false
	}
	for i, u := range pool {
		if dials[i] != u.Dial {
			return false
		}
	}
	return true
}

// attempt is the pick of a request's current attempt, kept in the
// request's variables until the next attempt or the request's end reports
// its outcome.
type attempt struct {
	mu       sync.Mutex
	pick     balancer.Pick
	upstream *reverseproxy.Upstream
	repl     *caddy.Replacer
	over     bool // the request's context ended: later picks end at once
}

// attemptVar is the request variable holding the *attempt.
const attemptVar = "pushlb.attempt"

// The placeholders reverse_proxy sets once an upstream answered.
const (
	statusPlaceholder  = "http.reverse_proxy.status_code"
	latencyPlaceholder = "http.reverse_proxy.upstream.latency"
)

// track ends the request's previous attempt (a is nil for the first) and
// starts p's.
func track(r *http.Request, a *attempt, p balancer.Pick, u *reverseproxy.Upstream) {
	ctx := r.Context()
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		p.End() // not a Caddy request (a test calling Select): nothing to learn
		return
	}
	if a == nil {
		a = &attempt{repl: repl}
		caddyhttp.SetVar(ctx, attemptVar, a)
		context.AfterFunc(ctx, a.end)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.over {
		p.End()
		return
	}
	a.report()
	// The placeholders now tell whether this attempt got an answer.
	repl.Delete(statusPlaceholder)
	repl.Delete(latencyPlaceholder)
	a.pick, a.upstream = p, u
}

// end reports the last attempt when the request is over.
func (a *attempt) end() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.report()
	a.over = true
}

// report reports the outcome of the current attempt, once. a.mu is held.
func (a *attempt) report() {
	if a.pick.Server == nil {
		return
	}
	p := a.pick
	a.pick = balancer.Pick{}
	if _, answered := a.repl.Get(statusPlaceholder); answered {
		latency, _ := a.repl.Get(latencyPlaceholder)
		d, _ := latency.(time.Duration)
		p.Done(balancer.DoneInfo{ResponseTime: d})
		return
	}
	p.Done(balancer.DoneInfo{Err: errNoResponse, ConnectFailure: true})
}

// errNoResponse is the outcome of an attempt that got no response.
var errNoResponse = errors.New("pushlb: no response from the upstream")

// Interface guards
var (
	_ caddy.Provisioner     = (*Selection)(nil)
	_ caddy.Validator       = (*Selection)(nil)
	_ caddy.CleanerUpper    = (*Selection)(nil)
	_ reverseproxy.Selector = (*Selection)(nil)
)
