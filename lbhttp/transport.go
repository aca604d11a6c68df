package lbhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
)

// BalancerMap is a fixed set of balancers by service name: a
// balancer.Balancers for tests and for programs that build their balancers
// themselves. It must not be modified once in use.
type BalancerMap map[string]*balancer.Balancer

// Get returns the balancer of name, or an error wrapping ErrUnknownService.
func (m BalancerMap) Get(name string) (*balancer.Balancer, error) {
	if b := m[name]; b != nil {
		return b, nil
	}
	return nil, ErrUnknownService
}

// Observer receives the events of the Transport, for metrics. Every field
// is optional. The functions are called synchronously on the request's
// goroutine, from any number of goroutines at once: they must be safe for
// concurrent use and quick, and must not modify the *balancer.Server.
type Observer struct {
	// OnPick is called before each attempt with the server it goes to (the
	// same server again for a same-server retry).
	OnPick func(service string, server *balancer.Server)
	// OnRetry is called before each retry with the failure that caused it.
	OnRetry func(service string, cause error)
	// OnRetryDenied is called when the retry budget refuses a retry the
	// retry policy allowed (see RetryBudget).
	OnRetryDenied func(service string)
	// OnResult is called when an attempt ends, with a response or an error.
	OnResult func(r Result)
}

// Result describes one attempt, for Observer.OnResult.
type Result struct {
	// Service is the service name.
	Service string
	// Server is the server the attempt went to.
	Server *balancer.Server
	// Attempt numbers the attempts of one request from 1.
	Attempt int
	// Status is the response's status code, 0 when Err is set.
	Status int
	// Err is the attempt's error, nil when a response arrived.
	Err error
	// ConnectFailure reports whether Err is a connection failure (nothing
	// was sent); it counts towards the server's circuit breaker.
	ConnectFailure bool
	// Duration is the time from the start of the attempt to the response
	// headers or the error.
	Duration time.Duration
}

// Option customises a Transport.
type Option func(*Transport) error

// WithObserver sets the hooks told about picks, retries and results.
func WithObserver(o Observer) Option {
	return func(t *Transport) error {
		t.obs = o
		return nil
	}
}

// WithLogger sets the logger; retries are logged at debug level. The
// default logs nothing.
func WithLogger(l zerolog.Logger) Option {
	return func(t *Transport) error {
		t.log = l
		return nil
	}
}

// WithTransportTemplate sets the *http.Transport each client's transport
// is cloned from (for TLS settings, pool sizes, HTTP/2, a proxy). The clone
// gets the client's timeouts: its DialContext is wrapped to time out after
// ConnectTimeout and to return *ConnectError (net.Dialer's DialContext when
// the template has none), and its ResponseHeaderTimeout is ReadTimeout. A
// DialTLSContext in the template is used as is, without those two. The
// template is not modified or used after the call.
func WithTransportTemplate(tmpl *http.Transport) Option {
	return func(t *Transport) error {
		if tmpl == nil {
			return optionError("nil transport template")
		}
		t.template = tmpl.Clone()
		return nil
	}
}

// WithRetryOnStatus makes responses with these status codes retryable,
// as Spring Cloud's retryableStatusCodes does: such a response counts as
// a failure of its server and, when a retry is allowed (an idempotent
// method, or RetryAllOperations, and a replayable body), the request is
// sent again with the usual same-server and next-server budget. When no
// retry is left, the last such response is returned as is. The default is
// no status-based retry: a response is the server's answer.
func WithRetryOnStatus(codes ...int) Option {
	return func(t *Transport) error {
		for _, c := range codes {
			if c < 200 || c > 599 {
				return optionError("retry status %d out of range 200-599", c)
			}
		}
		t.retryStatus = append(t.retryStatus, codes...)
		return nil
	}
}

// WithInlineHTTP1 sends the requests that allow it (no body, an
// idempotent method, no protocol upgrade, a plain-HTTP server) through a
// client of this package that writes each request and reads its response
// on the calling goroutine, over its own pool of keep-alive connections
// per server; the others go through the *http.Transport as usual. It
// spares net/http's hand-off of every request to a connection's writer
// goroutine and of its response back from the reader goroutine, which a
// gateway's profile shows as a tenth of its CPU.
//
// Responses are parsed by net/http (http.ReadResponse): framing, trailers
// and the checks against smuggling are the Transport's. The connect and
// read timeouts, the pooling defaults (128 idle connections per server,
// closed after 90 s idle), the retries and the stats are unchanged. An
// idle connection is checked before reuse (a non-blocking peek: the
// server must not have closed it or sent anything); a request that still
// finds it closed is sent again on a new connection, as net/http does.
// Of httptrace's hooks, only Got1xxResponse is called, with each 1xx
// answer before the final one (ReverseProxy's hook forwards them, 103
// Early Hints for example). It has no effect with WithTransportTemplate, whose settings only
// an *http.Transport honours, or where the system offers no
// non-blocking peek (Linux, the BSDs and macOS do).
func WithInlineHTTP1() Option {
	return func(t *Transport) error {
		t.inline = true
		return nil
	}
}

// Transport is an http.RoundTripper for URLs whose host is a service name
// ("http://orders/api/x"): each attempt chooses a server of that service
// from its balancer, sends the request there, records the outcome in the
// server's stats, and retries as the balancer's Config says.
//
// # Requests
//
// The URL's host (without a port) names the service; its scheme is
// replaced by the server's (Server.URLScheme) and its host by the server's
// address. The Host header follows the server address too, unless the
// caller set req.Host to something other than the URL's host: then it is
// kept. A zone or key set on the request's context with balancer.WithZone
// or balancer.WithKey steers the choice. The response's Request is the
// caller's request, so redirects resolve against the service URL.
//
// # Stats
//
// Each attempt is a balancer.Pick (balancer.Balancer.Pick for the first,
// Begin for a retry): the request counts as active on its server from the
// pick on. When a response arrives, whatever its status, Pick.Responded
// records the time to the response headers (and resets the server's
// successive-failure count); the request stays active until the body is
// read to the end or closed, then Pick.End ends it, so streaming
// responses (SSE, downloads) count as load for the rules and zone
// statistics. A response without a body, or a switched protocol (101,
// WebSocket), ends at once with Pick.Done. A failure ends with Pick.Done
// and the error: a connection failure (see IsConnectFailure) feeds the
// circuit breaker, other failures (read timeout, connection reset,
// cancelled request) only end the request. Close response bodies, as
// net/http asks: a body never closed leaves the count up until the
// balancer's active-request timeout (600 s) decays it.
//
// # Retries
//
// As Ribbon and Spring Cloud do, a failed attempt is retried up to
// MaxAutoRetries times on the same server, then on up to
// MaxAutoRetriesNextServer other servers (each with its own same-server
// retries). A server that failed is never the next one: the balancer is
// asked again a few times, then, if its rule keeps offering failed servers
// (a forced zone, a key), the zone is dropped and finally another alive
// server with a closed breaker is taken at random; when only failed
// servers remain, the request fails. A retry happens only when:
//
//   - the request's context is not done;
//   - the failure is a connection failure (nothing was sent, so any method
//     is safe), or the method is idempotent per RFC 9110 (GET, HEAD,
//     OPTIONS, TRACE, PUT, DELETE) or carries an Idempotency-Key header,
//     or the balancer's Config has RetryAllOperations;
//   - the body can be sent again: there is none, or req.GetBody replays
//     it, or the attempt failed to connect before reading any of it.
//
// A response is not retried unless its status was given to
// WithRetryOnStatus.
//
// # Timeouts and connections
//
// Each service (client) name has its own *http.Transport, built on first
// use from its balancer's Config: ConnectTimeout bounds each dial,
// ReadTimeout the wait for the response headers of each attempt (a body
// may stream for as long as it needs; use the request's context to bound
// the whole exchange). Without a template (WithTransportTemplate), pools
// keep up to 128 idle connections per server, and HTTP_PROXY is ignored.
//
// A Transport is safe for concurrent use. Build it with NewTransport.
type Transport struct {
	balancers   balancer.Balancers
	obs         Observer
	log         zerolog.Logger
	template    *http.Transport
	retryStatus []int
	budget      RetryBudget // WithRetryBudget
	inline      bool        // WithInlineHTTP1

	clients sync.Map // service name → *client
	// openGuards counts the guarded request bodies that an attempt's
	// transport has not closed yet (see bodyGuard).
	openGuards atomic.Int64
}

// NewTransport returns a Transport that finds each service's balancer in
// bs (a *balancer.Factory, a BalancerMap, or any balancer.Balancers); it
// calls bs.Get once per request.
func NewTransport(bs balancer.Balancers, opts ...Option) (*Transport, error) {
	if bs == nil {
		return nil, optionError("nil Balancers")
	}
	t := &Transport{balancers: bs, log: zerolog.Nop(), budget: DefaultRetryBudget}
	for i, o := range opts {
		if o == nil {
			return nil, optionError("nil option at index %d", i)
		}
		if err := o(t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// nextServerPicks is how many times the balancer is asked for a server
// other than the failed ones before the Transport looks further.
const nextServerPicks = 3

// RoundTrip sends req to a server of the service named by req.URL's host,
// retrying as the type documentation describes. Failures are *Error values
// wrapping ErrUnknownService, ErrNoServers or ErrAllTriesFailed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		closeRequestBody(req)
		return nil, &Error{Kind: ErrUnknownService, Err: errors.New("request has no URL")}
	}
	service := req.URL.Hostname()
	if service == "" {
		closeRequestBody(req)
		return nil, &Error{Kind: ErrUnknownService, Err: errors.New("request URL has no host")}
	}
	var b *balancer.Balancer
	var err error
	if cb, ok := t.balancers.(balancer.ContextBalancers); ok {
		b, err = cb.GetContext(req.Context(), service)
	} else {
		b, err = t.balancers.Get(service)
	}
	if err == nil && b == nil {
		err = errors.New("no balancer")
	}
	if err != nil {
		closeRequestBody(req)
		return nil, &Error{Kind: ErrUnknownService, Service: service, Err: err}
	}
	c := t.clientFor(service, b)
	ctx := req.Context()
	c.budget.requestStarted()
	defer c.budget.requestEnded()

	pick, err := b.Pick(ctx)
	if err != nil {
		closeRequestBody(req)
		return nil, &Error{Kind: ErrNoServers, Service: service, Err: err}
	}

	r := roundTrip{
		t:          t,
		c:          c,
		req:        req,
		service:    service,
		keepHost:   req.Host != "" && req.Host != req.URL.Host,
		hasBody:    req.Body != nil && req.Body != http.NoBody,
		idempotent: isIdempotent(req),
	}
	return r.run(ctx, pick)
}

// roundTrip is the state of one RoundTrip call.
type roundTrip struct {
	t          *Transport
	c          *client
	req        *http.Request
	service    string
	keepHost   bool
	hasBody    bool
	idempotent bool

	body     io.ReadCloser // the body of the next attempt; nil: req.Body
	guard    *bodyGuard    // the current attempt's guard, for bodies without GetBody
	attempts int
	failed   []string // IDs of the servers that failed, for the next-server choice
}

// run makes the attempts, starting with pick.
func (r *roundTrip) run(ctx context.Context, pick balancer.Pick) (*http.Response, error) {
	sameLeft, nextLeft := r.c.retry.sameServer, r.c.retry.nextServers
	var held *http.Response // a retryable-status response, kept until a retry is under way
	retrying := false       // the attempt is a retry, counted in the budget
	for {
		srv := pick.Server
		resp, connectFailure, err := r.attempt(ctx, pick)
		if retrying {
			r.c.budget.retryEnded()
			retrying = false
		}
		if err == nil && !slices.Contains(r.t.retryStatus, resp.StatusCode) {
			r.releaseBody()
			discard(held)
			return resp, nil
		}
		var cause error
		if err != nil {
			cause = err
		} else {
			// A retryable status: keep the newest answer.
			discard(held)
			held = resp
			cause = fmt.Errorf("status %d", resp.StatusCode)
		}

		var next *balancer.Server
		if r.mayRetry(ctx, connectFailure) {
			switch {
			case sameLeft > 0:
				sameLeft--
				next = srv
			case nextLeft > 0:
				r.failed = append(r.failed, srv.ID)
				if next = r.nextServer(ctx); next != nil {
					nextLeft--
					sameLeft = r.c.retry.sameServer
				}
			}
		}
		if next != nil && !r.c.budget.startRetry(connectFailure) {
			next = nil
			cause = fmt.Errorf("%w; no retry: the service's retry budget is spent", cause)
			if r.t.obs.OnRetryDenied != nil {
				r.t.obs.OnRetryDenied(r.service)
			}
		}
		retrying = next != nil
		var rewindErr error
		if next != nil {
			rewindErr = r.rewind(connectFailure)
		}
		if next == nil || rewindErr != nil {
			if retrying {
				r.c.budget.retryEnded()
			}
			r.releaseBody()
			if held != nil {
				return held, nil
			}
			if rewindErr != nil {
				cause = fmt.Errorf("%w; after %w", rewindErr, cause)
			}
			return nil, &Error{Kind: ErrAllTriesFailed, Service: r.service, Attempts: r.attempts, Server: srv.Addr(), Err: cause}
		}
		discard(held)
		held = nil
		if r.t.obs.OnRetry != nil {
			r.t.obs.OnRetry(r.service, cause)
		}
		if e := r.t.log.Debug(); e.Enabled() {
			e.Str("service", r.service).Str("server", srv.String()).Str("next", next.String()).
				Int("attempt", r.attempts).Err(cause).Msg("lbhttp: retrying")
		}
		pick = r.c.b.Begin(next)
	}
}

// attempt sends the request to the server of pick once and reports the
// outcome through pick.
func (r *roundTrip) attempt(ctx context.Context, pick balancer.Pick) (*http.Response, bool, error) {
	srv := pick.Server
	r.attempts++
	if r.t.obs.OnPick != nil {
		r.t.obs.OnPick(r.service, srv)
	}
	// One allocation for the attempt's request, its URL and the tracking
	// of its response body.
	a := &attemptState{req: *r.req, url: *r.req.URL}
	out := &a.req
	a.url.Scheme = srv.URLScheme()
	a.url.Host = srv.Addr()
	out.URL = &a.url
	if !r.keepHost {
		out.Host = ""
	}
	if r.body != nil {
		out.Body = r.body
	}
	if r.hasBody && r.req.GetBody == nil {
		r.guard = newBodyGuard(out.Body, &r.t.openGuards)
		out.Body = r.guard
	}

	start := time.Now()
	resp, err := r.c.roundTrip(out)
	elapsed := time.Since(start)

	connectFailure := false
	if err == nil {
		if _, upgraded := resp.Body.(io.ReadWriteCloser); upgraded || resp.Body == nil || resp.Body == http.NoBody {
			// Nothing more to wait for. A switched protocol (WebSocket) is
			// a connection, not a request in flight; the proxy needs its
			// ReadWriteCloser as is.
			pick.Done(balancer.DoneInfo{ResponseTime: elapsed, ServerError: resp.StatusCode >= 500})
		} else {
			pick.RespondedWith(balancer.DoneInfo{ResponseTime: elapsed, ServerError: resp.StatusCode >= 500})
			a.body = activeBody{ReadCloser: resp.Body, pick: pick}
			resp.Body = &a.body
		}
		resp.Request = r.req
	} else {
		// A cancelled or expired request is not the server's fault.
		connectFailure = ctx.Err() == nil && IsConnectFailure(err)
		pick.Done(balancer.DoneInfo{Err: err, ConnectFailure: connectFailure})
	}
	if r.t.obs.OnResult != nil {
		res := Result{Service: r.service, Server: srv, Attempt: r.attempts, Err: err, ConnectFailure: connectFailure, Duration: elapsed}
		if resp != nil {
			res.Status = resp.StatusCode
		}
		r.t.obs.OnResult(res)
	}
	return resp, connectFailure, err
}

// attemptState is what one attempt allocates: the request sent, its URL,
// and the wrapper that keeps the request active until the response body
// ends.
type attemptState struct {
	req  http.Request
	url  url.URL
	body activeBody
}

// mayRetry reports whether the method, the body and the kind of failure
// allow another attempt.
func (r *roundTrip) mayRetry(ctx context.Context, connectFailure bool) bool {
	if ctx.Err() != nil {
		return false
	}
	if connectFailure {
		return !r.hasBody || r.req.GetBody != nil || r.guard.untouched()
	}
	return (r.idempotent || r.c.retry.allOps) && (!r.hasBody || r.req.GetBody != nil)
}

// rewind prepares the body of the next attempt.
func (r *roundTrip) rewind(connectFailure bool) error {
	switch {
	case !r.hasBody:
		return nil
	case r.req.GetBody != nil:
		body, err := r.req.GetBody()
		if err != nil {
			return fmt.Errorf("lbhttp: replay request body: %w", err)
		}
		r.body = body
		return nil
	case connectFailure && r.guard.untouched():
		// The dial failed before the body was read: hand the same body on.
		r.body = r.guard.rc
		r.guard = nil
		return nil
	default:
		return errors.New("lbhttp: request body cannot be replayed")
	}
}

// releaseBody hands a guarded body back to the transport of the last
// attempt, which closes it.
func (r *roundTrip) releaseBody() {
	if r.guard != nil {
		r.guard.release()
		r.guard = nil
	}
}

// nextServer returns a server that has not failed in this request, or nil
// when there is none. It asks the balancer first, then without a forced
// zone, then takes any other alive server with a closed breaker.
func (r *roundTrip) nextServer(ctx context.Context) *balancer.Server {
	b := r.c.b
	if !r.anyOther(b.ReachableServersFor(ctx)) {
		return nil
	}
	if s := r.pick(ctx, b); s != nil {
		return s
	}
	if _, forced := balancer.ZoneFrom(ctx); forced {
		if s := r.pick(balancer.WithZone(ctx, ""), b); s != nil {
			return s
		}
	}
	// The rule keeps returning failed servers (a key that hashes to one,
	// a custom rule): fail over at random among the healthy others.
	var candidates []*balancer.Server
	for _, s := range b.ReachableServersFor(ctx) {
		if !slices.Contains(r.failed, s.ID) && !s.PeekStats().CircuitTripped() {
			candidates = append(candidates, s)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	return candidates[rand.IntN(len(candidates))]
}

// pick asks the balancer a few times for a server that has not failed.
func (r *roundTrip) pick(ctx context.Context, b *balancer.Balancer) *balancer.Server {
	for range nextServerPicks {
		s, err := b.Choose(ctx)
		if err != nil {
			return nil
		}
		if !slices.Contains(r.failed, s.ID) {
			return s
		}
	}
	return nil
}

// anyOther reports whether list has a server that has not failed.
func (r *roundTrip) anyOther(list []*balancer.Server) bool {
	for _, s := range list {
		if !slices.Contains(r.failed, s.ID) {
			return true
		}
	}
	return false
}

// isIdempotent reports whether the request may be sent twice: an
// idempotent method per RFC 9110 section 9.2.2, or an Idempotency-Key
// header as net/http honours it.
func isIdempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	if _, ok := req.Header["Idempotency-Key"]; ok {
		return true
	}
	_, ok := req.Header["X-Idempotency-Key"]
	return ok
}

// discard drains a little of an unwanted response and closes it, so its
// connection may be reused.
func discard(resp *http.Response) {
	if resp == nil {
		return
	}
	io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}

// closeRequestBody closes the body of a request that is not sent, as a
// RoundTripper must.
func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

var (
	_ http.RoundTripper  = (*Transport)(nil)
	_ balancer.Balancers = BalancerMap(nil)
)
