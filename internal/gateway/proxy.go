package gateway

import (
	"fmt"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/lbhttp"
)

// proxy is the request path: lbhttp's reverse proxy over its balancing
// transport, reporting to the metrics.
type proxy struct {
	*lbhttp.Proxy
	transport *lbhttp.Transport
}

func newProxy(g *Gateway) (*proxy, error) {
	m := g.metrics
	t, err := lbhttp.NewTransport(g.bals,
		lbhttp.WithLogger(g.log),
		lbhttp.WithObserver(lbhttp.Observer{
			OnPick:  func(service string, _ *balancer.Server) { m.picks.WithLabelValues(service).Inc() },
			OnRetry: func(service string, _ error) { m.retries.WithLabelValues(service).Inc() },
			OnResult: func(r lbhttp.Result) {
				m.requests.WithLabelValues(r.Service).Observe(r.Duration.Seconds())
				switch {
				case r.Err == nil:
				case r.ConnectFailure:
					m.failures.WithLabelValues(r.Service, "connect").Inc()
				default:
					m.failures.WithLabelValues(r.Service, "other").Inc()
				}
			},
		}))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	opts := []lbhttp.ProxyOption{
		lbhttp.WithProxyLogger(g.log),
		// Only services the gateway has heard of (or routes name) are
		// served by the default rule: a made-up path must not create a
		// balancer.
		lbhttp.WithServices(func(service string) bool { return g.bals.lookup(service) != nil }),
	}
	var routes []lbhttp.Route
	for _, r := range g.cfg.Routes {
		routes = append(routes, lbhttp.Route{Prefix: r.Prefix, Service: r.Service, StripPrefix: r.StripPrefix})
	}
	if len(routes) > 0 {
		opts = append(opts, lbhttp.WithRoutes(routes...))
	}
	if !g.cfg.defaultRoutes() {
		opts = append(opts, lbhttp.WithoutDefaultRoute())
	}
	p, err := lbhttp.NewProxy(t, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &proxy{Proxy: p, transport: t}, nil
}

func (p *proxy) close() { p.transport.CloseIdleConnections() }
