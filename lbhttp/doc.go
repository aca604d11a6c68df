// Package lbhttp sends HTTP requests to services through pushlb's
// balancers: the client side of load balancing, as Ribbon's
// LoadBalancerInterceptor and Feign client are for Spring, and the reverse
// proxy a gateway serves.
//
// A [Transport] is a [net/http.RoundTripper] for URLs whose host is a
// service name:
//
//	factory, _ := balancer.NewFactory(cfg)  // or a BalancerMap
//	tr, _ := lbhttp.NewTransport(factory)
//	defer tr.CloseIdleConnections()
//	client := &http.Client{Transport: tr}
//	resp, err := client.Get("http://orders/api/x") // one instance of orders
//
// The Transport finds the service's balancer through a
// [balancer.Balancers] (a *balancer.Factory, a [BalancerMap]). For each
// attempt it takes a [balancer.Pick] (honouring balancer.WithZone and
// balancer.WithKey on the request's context), rewrites the URL to that
// server, and reports the outcome through the Pick: a response resets the
// server's successive-failure count and gives its response time at the
// headers, while the request stays active until the body ends (streams
// count as load); a connection failure feeds the server's circuit breaker. Failed attempts are
// retried as the balancer's Config says (MaxAutoRetries on the same server,
// MaxAutoRetriesNextServer on others, never the server that just failed),
// and non-idempotent requests only when nothing was sent, unless
// RetryAllOperations. Each service has its own connection pool with the
// ConnectTimeout and ReadTimeout of its Config.
//
// A [Proxy] is a [net/http.Handler] that forwards as
// [net/http/httputil.ReverseProxy] does (and through one for upgrades)
// over a Transport: "/orders/api/x" goes
// to "http://orders/api/x", explicit [Route] values map other prefixes, and
// failures become short 404, 502, 503 or 504 answers. Paths are cleaned
// before routing (dot-segments removed, %2e read as a dot, // merged); a
// path that would climb out of its route's prefix, or hides a dot-segment
// behind an encoded slash or backslash, gets 400. X-Real-IP and
// X-Forwarded-For are set from the connection, never taken from the client.
//
// A route may also send its requests to a subset of the instances,
// chosen by their metadata, or split them between subsets by weight for a
// canary ([Subsets]), and reads a request hint from the X-Pushlb-Hint
// header ([Hints].HintHeader, [DefaultHintHeader]).
//
// Errors are [*Error] values matching [ErrUnknownService], [ErrNoServers]
// (the balancer's own sentinel) or [ErrAllTriesFailed] with errors.Is, and
// their cause; [IsConnectFailure] tells a failure to connect from others.
// Metrics hang off an [Observer], so this package needs no metrics library.
package lbhttp
