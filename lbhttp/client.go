package lbhttp

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/pushlb/pushlb/balancer"
)

// client is what the Transport keeps per service (client) name: the
// balancer it was built for, that balancer's retry settings, and the
// *http.Transport with its timeouts. Entries are immutable; a new balancer
// for the name gets a new entry, which shares the *http.Transport when the
// timeouts are unchanged.
type client struct {
	b      *balancer.Balancer
	retry  retryPolicy
	budget *retryBudget // the service's retries in flight
	// connect and read are the timeouts rt was built with.
	connect, read time.Duration
	rt            *http.Transport
	// inline serves the requests it can (inlineEligible) when the Transport
	// has WithInlineHTTP1; nil otherwise.
	inline *inlinePool
}

// retryPolicy is the part of a balancer's Config that drives retries.
type retryPolicy struct {
	sameServer  int  // MaxAutoRetries
	nextServers int  // MaxAutoRetriesNextServer
	allOps      bool // RetryAllOperations
}

// Pooling defaults of the per-client transports, for a gateway that talks to
// many instances with many concurrent requests each. net/http's default of
// 2 idle connections per host would make it redial under load.
const (
	defaultMaxIdleConns        = 1024
	defaultMaxIdleConnsPerHost = 128
	defaultIdleConnTimeout     = 90 * time.Second
	defaultKeepAlive           = 30 * time.Second
	defaultTLSHandshakeTimeout = 10 * time.Second
	defaultExpectContinue      = time.Second
)

// clientFor returns the entry of service for balancer b, building it on
// first use. Concurrent first calls may each build one; one wins and the
// others are dropped before they ever dial. When a new balancer for the
// name has other timeouts, its new transport replaces the old one, whose
// idle connections are closed; connections busy at that moment go idle in
// the old pool and close after IdleConnTimeout.
func (t *Transport) clientFor(service string, b *balancer.Balancer) *client {
	for {
		v, ok := t.clients.Load(service)
		if ok {
			c := v.(*client)
			if c.b == b {
				return c
			}
			nc := t.newClient(b, c)
			if t.clients.CompareAndSwap(service, c, nc) {
				if nc.rt != c.rt {
					c.closeIdle()
				}
				return nc
			}
			continue
		}
		nc := t.newClient(b, nil)
		if _, loaded := t.clients.LoadOrStore(service, nc); !loaded {
			return nc
		}
	}
}

// newClient builds the entry for b, reusing old's transport when the
// timeouts have not changed.
func (t *Transport) newClient(b *balancer.Balancer, old *client) *client {
	cfg := b.Config()
	c := &client{
		b: b,
		retry: retryPolicy{
			sameServer:  cfg.MaxAutoRetries,
			nextServers: cfg.MaxAutoRetriesNextServer,
			allOps:      cfg.RetryAllOperations,
		},
		connect: cfg.ConnectTimeout,
		read:    cfg.ReadTimeout,
	}
	if old != nil {
		c.budget = old.budget // the service's requests in flight go on
	} else {
		c.budget = newRetryBudget(t.budget)
	}
	if old != nil && old.connect == c.connect && old.read == c.read {
		c.rt, c.inline = old.rt, old.inline
		return c
	}
	c.rt = t.newHTTPTransport(c.connect, c.read)
	if t.inline && t.template == nil && canPeekIdle {
		c.inline = newInlinePool(t.dialer(nil, c.connect), c.read)
	}
	return c
}

// roundTrip sends req: the inline client when it can,
// else the *http.Transport.
func (c *client) roundTrip(req *http.Request) (*http.Response, error) {
	if c.inline != nil && inlineEligible(req) {
		return c.inline.roundTrip(req)
	}
	return c.rt.RoundTrip(req)
}

// closeIdle closes the client's idle connections.
func (c *client) closeIdle() {
	c.rt.CloseIdleConnections()
	if c.inline != nil {
		c.inline.closeIdle()
	}
}

// newHTTPTransport builds the *http.Transport of one client: from the
// template when one was given, else with this package's pooling defaults.
// ConnectTimeout bounds each dial, ReadTimeout the wait for the response
// headers. Dial errors come back as *ConnectError.
func (t *Transport) newHTTPTransport(connect, read time.Duration) *http.Transport {
	var rt *http.Transport
	if t.template != nil {
		rt = t.template.Clone()
	} else {
		rt = &http.Transport{
			// No Proxy: service instances are reached directly, whatever
			// HTTP_PROXY says.
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          defaultMaxIdleConns,
			MaxIdleConnsPerHost:   defaultMaxIdleConnsPerHost,
			IdleConnTimeout:       defaultIdleConnTimeout,
			TLSHandshakeTimeout:   defaultTLSHandshakeTimeout,
			ExpectContinueTimeout: defaultExpectContinue,
		}
	}
	rt.DialContext = t.dialer(rt.DialContext, connect)
	rt.ResponseHeaderTimeout = read
	return rt
}

// dialer returns dial (a net.Dialer's when nil) bounded by the connect
// timeout, with its errors as *ConnectError.
func (t *Transport) dialer(dial func(context.Context, string, string) (net.Conn, error), connect time.Duration) func(context.Context, string, string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: defaultKeepAlive}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, connect)
		defer cancel()
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, &ConnectError{Addr: addr, Err: err}
		}
		return conn, nil
	}
}

// CloseIdleConnections closes the idle connections of every client's
// transport. Connections in use are not affected: they go back to their
// pool when their request ends.
func (t *Transport) CloseIdleConnections() {
	t.clients.Range(func(_, v any) bool {
		v.(*client).closeIdle()
		return true
	})
}
