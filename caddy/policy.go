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

// maxPicks bounds the instances pushlb picks for one attempt: the first
// one Caddy holds available is used. It also bounds the picks of one
// Select that Caddy's health refuses, before the policy falls back to any
// available upstream.
const maxPicks = 3

// Select chooses an upstream of pool for r.
func (s *Selection) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	if len(pool) == 0 {
		return nil
	}
	ctx := r.Context()
	a, _ := caddyhttp.GetVar(ctx, attemptVar).(*attempt)
	if pk, ok := caddyhttp.GetVar(ctx, pickedVar).(*picked); ok && pk.is(pool) {
		return pk.choose(r, a)
	}
	var (
		b    picker
		pctx context.Context
		byID map[string]int
	)
	if snap, ok := caddyhttp.GetVar(ctx, poolVar).(*poolSnapshot); ok && snap.hasBalancer && snap.is(pool) {
		// The pushlb source's whole list: pick from it, and have the
		// source hand over picked instances from now on.
		snap.source.pickedBy.CompareAndSwap(nil, s)
		b, pctx, byID = snap.balancer, snap.source.zoneCtx, snap.byID
	} else {
		f := s.foreignFor(pool)
		if f == nil {
			return anyAvailable(pool, a.lastDial())
		}
		b, pctx, byID = f.b, context.Background(), f.byID
	}
	pctx = s.pickContext(pctx, r, s.hint(r))
	previous := a.lastDial()
	for range maxPicks {
		p, err := b.Pick(pctx)
		if err != nil {
			break
		}
		i, ok := byID[p.Server.ID]
		// The index is checked against the address: the list may have
		// changed between the pool's making and the pick.
		if !ok || i >= len(pool) || pool[i].Dial != p.Server.Addr() || !pool[i].Available() || (pool[i].Dial == previous && len(pool) > 1) {
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

// picked is what the pushlb source hands Caddy under the pushlb policy
// for one attempt: first the instance the service's balancer picked
// (already started in pushlb's statistics), then up to maxPicks-1 others
// from the list, for Caddy's health to fall back on when it holds the
// pick unavailable. One allocation.
type picked struct {
	ups  [maxPicks]reverseproxy.Upstream
	pool [maxPicks]*reverseproxy.Upstream
	pick balancer.Pick // of ups[0]
	n    int
}

// pickedVar is the request variable through which GetUpstreams hands its
// picks to the policy.
const pickedVar = "pushlb.picked"

// candidates picks the instance of s for r's next attempt with the
// balancer (one pick: the rule's state moves once per attempt) and
// returns it, followed by the next instances of the list, as upstreams.
// The instance of the attempt Caddy is retrying is avoided: when the
// source's zone offers no other, the pick leaves the zone, and the
// instance is used again only when there is no other.
func (s *poolSnapshot) candidates(r *http.Request, sel *Selection) []*reverseproxy.Upstream {
	a, _ := caddyhttp.GetVar(r.Context(), attemptVar).(*attempt)
	a.finish() // Caddy retries: the previous attempt's outcome first
	avoid := a.lastDial()
	hint := sel.hint(r)
	// The instances the pick chooses among: those of the hint while one is
	// alive, as the balancer decides; the list's others stand in only for
	// a request without a hint, or whose hint no instance carries.
	dials := s.dials
	if hinted := s.byHint[hint]; len(hinted) > 0 {
		dials = hinted
	}
	pickIn := func(ctx context.Context) (balancer.Pick, bool) {
		p, err := s.balancer.Pick(sel.pickContext(ctx, r, hint))
		if err != nil {
			return p, false
		}
		if p.Server.Addr() == avoid && len(dials) > 1 {
			p.End() // never sent
			return p, false
		}
		return p, true
	}
	p, ok := pickIn(s.source.zoneCtx)
	if !ok && avoid != "" && s.source.Zone != "" {
		p, ok = pickIn(context.Background())
	}
	pk := &picked{}
	first := 0
	if ok {
		pk.pick = p
		pk.add(p.Server.Addr())
		first = s.byID[p.Server.ID] + 1
	}
	if len(dials) != len(s.dials) {
		first = rand.IntN(len(dials)) // the hint's instances: no index of their own
	}
	for i := range len(dials) {
		if pk.n == maxPicks {
			break
		}
		if d := dials[(first+i)%len(dials)]; d != avoid && !pk.has(d) {
			pk.add(d)
		}
	}
	if pk.n == 0 && avoid != "" {
		pk.add(avoid) // the only instance
	}
	if pk.n == 0 {
		return nil
	}
	caddyhttp.SetVar(r.Context(), pickedVar, pk)
	return pk.pool[:pk.n]
}

func (pk *picked) add(addr string) {
	pk.ups[pk.n].Dial = addr
	pk.pool[pk.n] = &pk.ups[pk.n]
	pk.n++
}

func (pk *picked) has(addr string) bool {
	for i := range pk.n {
		if pk.ups[i].Dial == addr {
			return true
		}
	}
	return false
}

// is reports whether pool is pk's.
func (pk *picked) is(pool []*reverseproxy.Upstream) bool {
	return len(pool) == pk.n && pool[0] == pk.pool[0]
}

// choose returns the first upstream of pk Caddy holds available: the
// pick, or else one of the others (outside pushlb's statistics).
func (pk *picked) choose(r *http.Request, a *attempt) *reverseproxy.Upstream {
	p := pk.pick
	pk.pick = balancer.Pick{} // a second Select of this pool starts nothing
	for i := range pk.n {
		if !pk.pool[i].Available() {
			continue
		}
		if i > 0 || p.Server == nil || p.Server.Addr() != pk.ups[0].Dial {
			p.End() // the pick was not sent
			p = balancer.Pick{}
		}
		track(r, a, p, pk.pool[i])
		return pk.pool[i]
	}
	p.End()
	return nil
}

// is reports whether pool is a copy of s (as copyUpstreams makes).
func (s *poolSnapshot) is(pool []*reverseproxy.Upstream) bool {
	return len(pool) == len(s.dials) && pool[0].Dial == s.dials[0] && pool[len(pool)-1].Dial == s.dials[len(pool)-1]
}

// picker is the balancer a Select picks with: the service's view
// (pushlb.Balancer, one pointer: no allocation as an interface) or the
// policy's own balancer.
type picker interface {
	Pick(context.Context) (balancer.Pick, error)
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

// anyAvailable returns an available upstream of pool not dialled at
// avoid when there is one (one dialled at avoid otherwise), by reservoir
// sampling as Caddy's random policy does; nil when none is available.
func anyAvailable(pool []*reverseproxy.Upstream, avoid string) *reverseproxy.Upstream {
	var chosen, avoided *reverseproxy.Upstream
	n := 0
	for _, u := range pool {
		if !u.Available() {
			continue
		}
		if u.Dial == avoid {
			avoided = u
			continue
		}
		n++
		if rand.IntN(n) == 0 {
			chosen = u
		}
	}
	if chosen == nil {
		return avoided
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
	mu   sync.Mutex
	pick balancer.Pick
	dial string // the upstream of the last attempt
	repl *caddy.Replacer
	over bool // the request's context ended: later picks end at once
}

// lastDial returns the address of the request's last attempt, "" for
// none. a may be nil. Only the request's goroutine calls it.
func (a *attempt) lastDial() string {
	if a == nil {
		return ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dial
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
	a.pick, a.dial = p, u.Dial
}

// finish reports the outcome of the current attempt, if not yet done.
// a may be nil.
func (a *attempt) finish() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.report()
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
	if st, answered := a.repl.Get(statusPlaceholder); answered {
		latency, _ := a.repl.Get(latencyPlaceholder)
		d, _ := latency.(time.Duration)
		code, _ := st.(int)
		p.Done(balancer.DoneInfo{ResponseTime: d, ServerError: code >= 500})
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
