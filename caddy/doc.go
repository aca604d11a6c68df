// Package pushlbcaddy makes pushlb a Caddy module: Caddy's reverse_proxy
// gets the live instances of a service pushed over NATS, instead of
// polling a DNS or a registry, and may pick among them with pushlb's
// rules, zones and circuit breaker.
//
// It registers two modules: Upstreams, the dynamic upstream source
// "pushlb" (http.reverse_proxy.upstreams.pushlb), and Selection, the
// selection policy "pushlb" (http.reverse_proxy.selection_policies.pushlb):
//
//	reverse_proxy {
//		dynamic pushlb orders {
//			nats nats://127.0.0.1:4222
//			zone us-east-1a
//		}
//		lb_policy pushlb
//	}
//
// Under the pushlb policy a request may name a group of instances with
// the header X-Pushlb-Hint (lb_policy pushlb { hint_header <name>|- }
// renames it or turns it off): the instances announced with metadata
// hint=<value> take it while one of them is alive, and otherwise it goes
// where it would have gone without the header, as the gateway's
// hintHeader (balancer.WithHint).
//
// It is a Go module of its own (github.com/pushlb/pushlb/caddy), so that
// pushlb's main module does not depend on Caddy; cmd/caddy builds a caddy
// binary with Caddy's standard modules and these. docs/caddy.md is the
// user's guide.
//
// # Sharing across sites and reloads
//
// Every source with an equal ClientConfig shares one NATS connection and one
// started pushlb.Client, held in a caddy.UsagePool: the sites of a config
// share it, and a reloaded config takes the running one (its lists, its
// subscriptions, its gossip node) before the old config's cleanup drops
// its reference. The client closes when no loaded config uses it. Its
// logs go through Caddy's default logger, named "pushlb"; its state is
// in Caddy's metrics.
//
// # Threading
//
// GetUpstreams and Select run on request goroutines, concurrently: they
// read immutable snapshots (one per followed service, replaced whole by
// the client's Watch callback when the service's instances change) and
// the balancers, which take no lock to pick. Each request gets upstreams
// of its own, because Caddy writes into them. A request's attempts are
// reported to pushlb's statistics in order on the request's goroutine;
// its last one when its context ends, on a goroutine of its own.
package pushlbcaddy
