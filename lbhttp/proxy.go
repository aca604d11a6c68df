package lbhttp

import (
	"errors"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/rs/zerolog"
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
			r.Prefix = strings.TrimSuffix(r.Prefix, "/")
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
func WithProxyLogger(l zerolog.Logger) ProxyOption {
	return func(p *Proxy) error {
		p.log = l
		return nil
	}
}

// Proxy is an http.Handler that forwards requests to services through a
// Transport, with net/http/httputil's ReverseProxy.
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
// # Forwarding
//
// The request goes out with X-Forwarded-For (the client's address; values
// sent by the client are dropped, not trusted), X-Forwarded-Host and
// X-Forwarded-Proto, and X-Forwarded-Prefix when a prefix was stripped.
// The Host header is the server's address unless WithPreserveHost.
// Responses are flushed as they arrive (server-sent events and other
// streams pass through), and protocol upgrades (WebSocket) are tunnelled.
//
// # Errors
//
// Clients get a short plain-text answer, never internal details:
//
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
	log          zerolog.Logger
}

// NewProxy returns a Proxy that forwards through rt, normally a *Transport
// (any RoundTripper that understands service URLs and returns this
// package's errors will do).
func NewProxy(rt http.RoundTripper, opts ...ProxyOption) (*Proxy, error) {
	if rt == nil {
		return nil, optionError("nil RoundTripper")
	}
	p := &Proxy{defaultRoute: true, log: zerolog.Nop()}
	for i, o := range opts {
		if o == nil {
			return nil, optionError("nil proxy option at index %d", i)
		}
		if err := o(p); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(p.routes, func(a, b Route) int { return len(b.Prefix) - len(a.Prefix) })
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     rt,
		FlushInterval: -1,
		ErrorHandler:  p.handleError,
		ErrorLog:      log.New(p.log, "", 0),
		BufferPool:    newCopyBuffers(),
	}
	return p, nil
}

// ServeHTTP forwards r to the service its path routes to.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, _, _, ok := p.route(r.URL); !ok {
		p.log.Debug().Str("path", r.URL.Path).Msg("lbhttp: no route")
		http.Error(w, "no route", http.StatusNotFound)
		return
	}
	p.rp.ServeHTTP(w, r)
}

// rewrite turns the inbound request into one for the routed service.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	service, prefix, rest, _ := p.route(pr.In.URL)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = service
	out.URL.Path, out.URL.RawPath = rest, ""
	if strings.IndexByte(rest, '%') >= 0 {
		if path, err := url.PathUnescape(rest); err == nil {
			out.URL.Path, out.URL.RawPath = path, rest
		}
	}
	if prefix != "" {
		out.Header.Set("X-Forwarded-Prefix", prefix)
	} else {
		out.Header.Del("X-Forwarded-Prefix")
	}
	if !p.preserveHost {
		out.Host = ""
	}
	pr.SetXForwarded()
}

// route finds the service of a request: its name, the stripped prefix
// (empty when none), and the escaped path to send.
func (p *Proxy) route(u *url.URL) (service, stripped, rest string, ok bool) {
	path := u.EscapedPath()
	if !strings.HasPrefix(path, "/") {
		return "", "", "", false
	}
	for _, r := range p.routes {
		if !underPrefix(path, r.Prefix) {
			continue
		}
		if !r.StripPrefix {
			return r.Service, "", path, true
		}
		rest = path[len(r.Prefix):]
		if rest == "" {
			rest = "/"
		}
		return r.Service, r.Prefix, rest, true
	}
	if !p.defaultRoute {
		return "", "", "", false
	}
	service, rest = path[1:], "/"
	if i := strings.IndexByte(service, '/'); i >= 0 {
		service, rest = service[:i], service[i:]
	}
	if !plausibleService(service) || (p.known != nil && !p.known(service)) {
		return "", "", "", false
	}
	return service, path[:len(service)+1], rest, true
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
	service := ""
	attempts := 0
	if errors.As(err, &e) {
		service, attempts = e.Service, e.Attempts
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
	case errors.Is(err, ErrNoServers):
		status, msg = http.StatusServiceUnavailable, "no instances of "+service+" available"
	case isTimeout(err):
		status, msg = http.StatusGatewayTimeout, service+" timed out"
	case service != "":
		status, msg = http.StatusBadGateway, service+" unavailable"
	default:
		status, msg = http.StatusBadGateway, "bad gateway"
	}
	ev := p.log.Warn()
	if status == http.StatusNotFound {
		ev = p.log.Debug()
	}
	ev.Str("service", service).Int("attempts", attempts).Int("status", status).Err(err).
		Msg("lbhttp: proxy error")
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
