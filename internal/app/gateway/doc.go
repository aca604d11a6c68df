// Package gateway is the embedding of pushlb that cmd/gateway runs: an HTTP
// reverse proxy whose balancers are fed by the push path.
//
// Start first binds each of its addresses once and checks the embedded
// server's data directory, so that an address in use or an unwritable
// directory is reported at once with the system's error. It then wires, in
// order: NATS (an embedded server with JetStream when no URL is configured,
// its writes forced to disk as dataSync says, always or at most an interval
// after them; its own startup error is reported), the registry bucket, the balancer factory (per-client
// settings from YAML or Ribbon properties), the subscriber (which owns the
// registry mirror) with one lbvisitor per service, the lbhttp proxy (with
// the per-request hints of its routes: a zone header, a hash key) on a
// listener with read, idle and header limits and a connection limit
// (HTTPConfig), and the admin listener (/-/lb, /metrics, /healthz for
// liveness, /readyz for routing state, which stays ready while NATS is
// down). Shutdown stops accepting, finishes in-flight requests within a
// bound, and stops everything in the reverse order.
package gateway
