package lbhttp

import (
	"errors"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
)

// Route sends the requests under a path prefix to a service.
type Route struct {
	// Prefix is the path prefix, starting with "/". It matches at a segment
	// boundary: "/api/orders" (or "/api/orders/") matches "/api/orders"
	// and "/api/orders/x", not "/api/ordersx". It is compared byte for byte
	// with the request's escaped path (URL.EscapedPath), so write special
	// characters escaped. "/" matches every path.
	Prefix string `yaml:"prefix"`
	// Service is the service (balancer) name.
	Service string `yaml:"service"`
	// StripPrefix removes the prefix from the path sent to the service:
	// "/api/orders/x" goes out as "/x", "/api/orders" as "/". The removed
	// prefix is sent in X-Forwarded-Prefix.
	StripPrefix bool `yaml:"stripPrefix"`
	// Hints say where this route's requests carry a zone to prefer and a
	// key for keyed rules; fields left empty take those of WithHints. In
	// YAML their keys sit in the route itself:
	// {prefix: /cart, service: cart, hashKey: {cookie: SESSION}}.
	Hints `yaml:",inline"`
}

// ProxyOption customises a Proxy.
type ProxyOption func(*Proxy) error

// WithRoutes adds explicit routes. The longest matching prefix wins, and
// any explicit route wins over the default rule.
func WithRoutes(routes ...Route) ProxyOption {
	return func(p *Proxy) error {
		for _, r := range routes {
			if !strings.HasPrefix(r.Prefix, "/") {
				return optionError("route prefix %q must start with /", r.Prefix)
			}
			if !plausibleService(r.Service) {
				return optionError("route %q: invalid service name %q", r.Prefix, r.Service)
			}
			if err := r.Hints.Validate(); err != nil {
				return optionError("route %q: %v", r.Prefix, err)
			}
			r.Prefix = strings.TrimSuffix(r.Prefix, "/")
			if needsCleaning(r.Prefix) {
				return optionError("route prefix %q has an empty or dot segment", r.Prefix+"/")
			}
			for _, o := range p.routes {
				if o.Prefix == r.Prefix {
					return optionError("duplicate route prefix %q", r.Prefix+"/")
				}
			}
			p.routes = append(p.routes, r)
		}
		return nil
	}
}

// WithoutDefaultRoute turns off the default rule, so that only explicit
// routes are served.
func WithoutDefaultRoute() ProxyOption {
	return func(p *Proxy) error {
		p.defaultRoute = false
		return nil
	}
}

// WithServices restricts the default rule to the services known reports
// true for; other first path segments get 404 without reaching the
// Balancers. Use it with a *balancer.Factory, which would otherwise build
// a balancer for every name a client makes up. It is called on every
// request the default rule serves, from many goroutines at once.
func WithServices(known func(service string) bool) ProxyOption {
	return func(p *Proxy) error {
		if known == nil {
			return optionError("nil service filter")
		}
		p.known = known
		return nil
	}
}

// WithPreserveHost sends the client's Host header to the service instead
// of the server's address (Spring Cloud Gateway's PreserveHostHeader).
func WithPreserveHost() ProxyOption {
	return func(p *Proxy) error {
		p.preserveHost = true
		return nil
	}
}

// WithProxyLogger sets the logger of failed requests: 5xx answers at warn
// level, 404s and requests abandoned by their client at debug level. The
// default logs nothing.
//
// Warnings are limited per upstream (service, server last tried and
// status): the first failure is logged at once, later ones at most once
// per 10 s, each line with "folded", the failures not logged since the
// previous one. A dead instance under load thus costs one line per 10 s;
// the metrics still count every failure.
func WithProxyLogger(l zerolog.Logger) ProxyOption {
	return func(p *Proxy) error {
		p.log = l
		return nil
	}
}

// Proxy is an http.Handler that forwards requests to services through a
// Transport, as net/http/httputil's ReverseProxy does: it forwards most
// requests itself, with ReverseProxy's rules and fewer allocations, and
// hands protocol upgrades and query strings ReverseProxy would re-encode
// to a ReverseProxy.
//
// # Routing
//
// Explicit routes (WithRoutes) are tried first, longest prefix first.
// Otherwise the default rule maps "/<service>/<rest>" to service <service>
// with path "/<rest>" (the query is kept): "/orders/api/x?q=1" goes to
// "http://orders/api/x?q=1", which the Transport balances over the
// instances of orders. A first segment that is not a plausible service
// name (letters, digits, '.', '-', '_') does not match.
//
// # Paths
//
// Before routing, the escaped path loses its dot-segments and empty
// segments (RFC 3986 section 5.2.4, with "%2e" and "%2E" read as "."):
// "/orders/./x", "/orders/%2e/x" and "//orders//x" all route and go out as
// "/orders/x". Other escapes, "%2F" included, are data inside a segment and
// stay as they are. A ".." may only remove segments below the route's
// prefix ("/orders/a/../x" is "/orders/x"); one that would remove a segment
// of the prefix, or climb above the root, gets 400 ("/orders/../billing/x"
// does not reach billing). So does a dot-segment hidden from this rule
// behind an escaped slash or backslash, a backslash or a path parameter
// ("/orders/..%2Fx", "/orders/a%5C..", "/orders/..;/x"), which services
// that decode or split on those would still climb with. The route is
// therefore the one the path names, and no service sees a dot-segment.
//
// # Hints
//
// A route may read balancer hints from each request (Hints, WithHints): a
// zone to prefer from a header (balancer.WithZone), and a key for keyed
// rules from a header, a cookie, a query parameter or the client's address
// (balancer.WithKey). The request reaches the Transport with them on its
// context. The hint headers, cookies and parameters are forwarded as they
// are.
//
// # Forwarding
//
// The request goes out with X-Real-IP and X-Forwarded-For set to the
// address of the client's connection, X-Forwarded-Host, X-Forwarded-Proto,
// and X-Forwarded-Prefix when a prefix was stripped. Values of these
// headers (and Forwarded) sent by the client are dropped, never trusted or
// appended to: behind another proxy, the address is that proxy's. The Host
// header is the server's address unless WithPreserveHost.
// Responses are flushed as they arrive (server-sent events and other
// streams pass through), and protocol upgrades (WebSocket) are tunnelled.
//
// # Errors
//
// Clients get a short plain-text answer, never internal details:
//
//   - 400 when a ".." in the path climbs above its route's prefix;
//   - 404 when no route matches, or the service is unknown to the
//     Balancers (the path names nothing the gateway serves);
//   - 503 when the service is known but has no instance available;
//   - 504 when the last attempt timed out (connect or read timeout);
//   - 502 when every attempt failed otherwise (connection refused, reset).
//
// A Proxy is safe for concurrent use. Build it with NewProxy.
type Proxy struct {
	rp           *httputil.ReverseProxy
	routes       []Route // prefixes without a trailing "/", longest first
	defaultRoute bool
	preserveHost bool
	known        func(string) bool
	hints        Hints // the default rule's (WithHints)
	hinted       bool  // some route reads hints
	log          zerolog.Logger
	errLog       *errorLog   // which failures are logged
	buffers      copyBuffers // response copies, forward's and rp's
}

// NewProxy returns a Proxy that forwards through rt, normally a *Transport
// (any RoundTripper that understands service URLs and returns this
// package's errors will do).
func NewProxy(rt http.RoundTripper, opts ...ProxyOption) (*Proxy, error) {
	if rt == nil {
		return nil, optionError("nil RoundTripper")
	}
	p := &Proxy{defaultRoute: true, log: zerolog.Nop(), errLog: newErrorLog(), buffers: newCopyBuffers()}
	for i, o := range opts {
		if o == nil {
			return nil, optionError("nil proxy option at index %d", i)
		}
		if err := o(p); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(p.routes, func(a, b Route) int { return len(b.Prefix) - len(a.Prefix) })
	p.hinted = p.defaultRoute && !p.hints.IsZero()
	for i := range p.routes {
		p.routes[i].Hints = p.routes[i].Hints.over(p.hints)
		p.hinted = p.hinted || !p.routes[i].Hints.IsZero()
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     rt,
		FlushInterval: 0, // flushWriter flushes responses of known length; ReverseProxy the others
		ErrorHandler:  p.handleError,
		ErrorLog:      log.New(p.log, "", 0),
		BufferPool:    p.buffers,
	}
	return p, nil
}

// ServeHTTP forwards r to the service its path routes to.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.EscapedPath()
	if needsCleaning(path) {
		clean, ok := p.cleanPath(path)
		if !ok {
			p.log.Debug().Str("path", path).Msg("lbhttp: path climbs above its route")
			http.Error(w, "bad path", http.StatusBadRequest)
			return
		}
		r = withPath(r, clean)
		path = clean
	}
	m, ok := p.route(path)
	if !ok {
		p.log.Debug().Str("path", r.URL.Path).Msg("lbhttp: no route")
		http.Error(w, "no route", http.StatusNotFound)
		return
	}
	if p.hinted && !m.hints.IsZero() {
		if ctx, ok := m.hints.context(r, m.service); ok {
			r = r.WithContext(ctx)
		}
	}
	fw := &flushWriter{ResponseWriter: w}
	if canForward(r) {
		p.forward(fw, r)
		return
	}
	p.rp.ServeHTTP(fw, r)
}

// rewrite turns the inbound request into one for the routed service.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	m, _ := p.route(pr.In.URL.EscapedPath())
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = m.service
	out.URL.Path, out.URL.RawPath = m.rest, ""
	if strings.IndexByte(m.rest, '%') >= 0 {
		if path, err := url.PathUnescape(m.rest); err == nil {
			out.URL.Path, out.URL.RawPath = path, m.rest
		}
	}
	if m.stripped != "" {
		out.Header.Set("X-Forwarded-Prefix", m.stripped)
	} else {
		out.Header.Del("X-Forwarded-Prefix")
	}
	// ReverseProxy removed the client's X-Forwarded-* and Forwarded;
	// X-Real-IP is this proxy's to set too.
	if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
		out.Header.Set("X-Real-Ip", ip)
	} else {
		out.Header.Del("X-Real-Ip")
	}
	if !p.preserveHost {
		out.Host = ""
	}
	pr.SetXForwarded()
}

// match is a routed request.
type match struct {
	service  string
	prefix   string // the route's prefix: "/<service>" for the default rule
	depth    int    // segments in prefix
	stripped string // the prefix removed from the path, or ""
	rest     string // the escaped path to send
	hints    *Hints // where the request's balancer hints are
}

// route finds the service of a request from its escaped path.
func (p *Proxy) route(path string) (m match, ok bool) {
	if !strings.HasPrefix(path, "/") {
		return m, false
	}
	for i := range p.routes {
		r := &p.routes[i]
		if !underPrefix(path, r.Prefix) {
			continue
		}
		m = match{service: r.Service, prefix: r.Prefix, depth: strings.Count(r.Prefix, "/"), rest: path, hints: &r.Hints}
		if r.StripPrefix {
			m.stripped, m.rest = r.Prefix, path[len(r.Prefix):]
			if m.rest == "" {
				m.rest = "/"
			}
		}
		return m, true
	}
	if !p.defaultRoute {
		return m, false
	}
	service, rest := path[1:], "/"
	if i := strings.IndexByte(service, '/'); i >= 0 {
		service, rest = service[:i], service[i:]
	}
	if !plausibleService(service) || (p.known != nil && !p.known(service)) {
		return m, false
	}
	prefix := path[:len(service)+1]
	return match{service: service, prefix: prefix, depth: 1, stripped: prefix, rest: rest, hints: &p.hints}, true
}

// withPath returns a shallow copy of r whose URL has the escaped path
// clean, for the ReverseProxy's Rewrite and the logs.
func withPath(r *http.Request, clean string) *http.Request {
	r2 := new(http.Request)
	*r2 = *r
	r2.URL = new(url.URL)
	*r2.URL = *r.URL
	r2.URL.RawPath = clean
	if path, err := url.PathUnescape(clean); err == nil {
		r2.URL.Path = path
	}
	return r2
}

// underPrefix reports whether path is prefix or below it; prefix has no
// trailing "/" ("" is the root).
func underPrefix(path, prefix string) bool {
	return strings.HasPrefix(path, prefix) && (len(path) == len(prefix) || path[len(prefix)] == '/')
}

// plausibleService reports whether s may be a service name: NATS-token
// safe, as the wire protocol requires, and not "." or "..".
func plausibleService(s string) bool {
	if s == "" || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// handleError answers a request that got no response, briefly, and logs
// why.
func (p *Proxy) handleError(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	var noSubset *balancer.NoSubsetError
	service, server := "", ""
	attempts := 0
	if errors.As(err, &e) {
		service, server, attempts = e.Service, e.Server, e.Attempts
	}
	if r.Context().Err() != nil {
		// The client went away or gave up: nobody reads the answer.
		p.log.Debug().Str("service", service).Err(err).Msg("lbhttp: request abandoned by the client")
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	var status int
	var msg string
	switch {
	case errors.Is(err, ErrUnknownService):
		status, msg = http.StatusNotFound, "unknown service"
	case errors.As(err, &noSubset): // subsets.go: name the selector
		status, msg = http.StatusServiceUnavailable, service+": "+noSubset.Error()
	case errors.Is(err, ErrNoServers):
		status, msg = http.StatusServiceUnavailable, "no instances of "+service+" available"
	case isTimeout(err):
		status, msg = http.StatusGatewayTimeout, service+" timed out"
	case service != "":
		status, msg = http.StatusBadGateway, service+" unavailable"
	default:
		status, msg = http.StatusBadGateway, "bad gateway"
	}
	if status == http.StatusNotFound {
		p.log.Debug().Str("service", service).Int("status", status).Err(err).Msg("lbhttp: proxy error")
	} else if ok, folded := p.errLog.allow(errorLogKey{service, server, status}); ok {
		// One line per upstream and interval: the first failure, then the
		// count folded since.
		ev := p.log.Warn().Str("service", service).Str("server", server).Int("attempts", attempts).Int("status", status).Err(err)
		if folded > 0 {
			ev = ev.Int("folded", folded)
		}
		ev.Msg("lbhttp: proxy error")
	}
	http.Error(w, msg, status)
}

// copyBufferSize is the size of the buffers that copy response bodies,
// ReverseProxy's own default.
const copyBufferSize = 32 << 10

// copyBuffers lends ReverseProxy its copy buffers from a pool; without
// one, ReverseProxy allocates 32 KiB per request.
type copyBuffers struct{ pool *sync.Pool }

func newCopyBuffers() copyBuffers {
	return copyBuffers{pool: &sync.Pool{New: func() any { return new([copyBufferSize]byte) }}}
}

// Get returns a buffer of copyBufferSize bytes.
func (c copyBuffers) Get() []byte { return c.pool.Get().(*[copyBufferSize]byte)[:] }

// Put returns a buffer from Get to the pool.
func (c copyBuffers) Put(b []byte) {
	if cap(b) >= copyBufferSize {
		c.pool.Put((*[copyBufferSize]byte)(b[:copyBufferSize]))
	}
}

var (
	_ http.Handler        = (*Proxy)(nil)
	_ httputil.BufferPool = copyBuffers{}
)
