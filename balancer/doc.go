// Package balancer is pushlb's load-balancing core: Netflix Ribbon's model
// (rules, zone filters, per-server stats with a circuit breaker, zone
// awareness, ping, list updaters, per-client configuration) done the Go way.
//
// # Model
//
// A [Balancer] balances over the servers of one service. Every list change
// (SetServers, AddServers, MarkServerDown, a ping round) builds a new
// immutable [Snapshot] and swaps it in through an atomic pointer, as grpc-go
// regenerates its picker. A pick reads the current snapshot without taking
// a lock, and for the simple rules without allocating.
//
// Per-server statistics ([ServerStats]: active requests, response time,
// successive connection failures and the circuit breaker built on them) are
// keyed by instance ID, so they survive snapshot swaps: a server that stays in
// the list keeps its numbers.
//
// # A pick
//
// A pick goes through two steps:
//
//  1. The zone choice, by the balancer. A zone forced with [WithZone] is
//     used while it has a server whose breaker is closed; otherwise the
//     zone filter (Config.Filter: ZoneAffinity, ZonePreference or None)
//     narrows the candidates to the client's zone or leaves all of them.
//     Then, when zones are avoided (Config.ZoneAware, or the ZoneAvoidance
//     rule) and the candidates span several zones, zones that are blacked
//     out or overloaded are avoided as Ribbon's ZoneAwareLoadBalancer and
//     ZoneAvoidanceRule do, and one zone is drawn at random weighted by its
//     instance count: with ZoneAware alone only when some zone is avoided,
//     with ZoneAvoidance on every pick.
//  2. The [Rule] (RoundRobin, Random, WeightedResponseTime, BestAvailable,
//     LeastRequest, AvailabilityFiltering, ZoneAvoidance, Retry, Maglev
//     (configured as Maglev or Rendezvous), or one of your own) picks a
//     server. It gets a [PickInfo]: the chosen zone's
//     [View], the wider candidates to fall back on, the caller's context
//     (with the key of [WithKey]), the randomness and the clock. If it
//     declines a zone, it is asked once more with every alive server.
//
// The zone choice is decided off the pick path, as grpc-go builds a picker
// when its inputs change: from the zone statistics (instance count, tripped
// count, active requests, load per server), the filter's scope, the zones
// avoided and the cumulative weights of the zone draw are computed and
// published with the snapshot. A list change makes the decision with the
// new snapshot; a circuit breaker that trips or resets makes it again at
// once; load makes it again at most every Config.ZoneStatsInterval, when a
// request starts or ends or a Pick finds it that old; a blackout's end is
// seen by the next pick. A pick loads the decision, and draws a zone with
// one random number when zones are drawn: O(1), with no clock read for
// Choose unless a breaker is open, requests are in flight or load changed
// since.
//
// Ribbon applies its server-list filter only when the list is polled, so with
// push updates (no polling) a zone-affinity filter would never revisit its
// decision. pushlb's filter is part of the zone decision instead: it
// follows load and failures within ZoneStatsInterval.
//
// # Custom rules
//
// A Rule is one method, Choose(PickInfo) (*Server, error), and needs
// nothing from this package but what PickInfo carries, so it may be written
// anywhere and plugged in with [WithRule] (or, for every balancer of a
// [Factory], WithBalancerOptions(WithRule(r))). See [Rule] for its
// threading rules.
//
// # Reporting outcomes
//
// [Balancer.Pick] chooses a server and starts the request in its
// statistics; the returned [Pick] reports the outcome, as the Done callback
// of a grpc-go picker does:
//
//	p, err := b.Pick(ctx)
//	if err != nil {
//		return err // ErrNoServers
//	}
//	resp, err := send(ctx, p.Server.Addr())
//	if err != nil {
//		p.Done(balancer.DoneInfo{Err: err, ConnectFailure: isDialError(err)})
//		return err
//	}
//	p.Done(balancer.DoneInfo{}) // or Responded at the headers, End after the body
//
// Done ends the request: an answer resets the server's failure count and
// feeds its response-time average; a connection failure counts towards its
// circuit breaker. A streamed answer uses Responded when it starts and End
// when it is over, so that the response time is taken at the start and the
// request counts as load while it streams. [Balancer.Begin] makes a Pick
// for a server chosen otherwise (a same-server retry). [Balancer.Choose]
// only looks: it records nothing.
//
// # Weights
//
// A server may carry a weight (Server.Weight, 1 to MaxWeight, 0 meaning
// DefaultWeight): RoundRobin is then weighted round robin (exact per cycle
// of the weights' sum, interleaved), Random, LeastRequest and the
// round-robin tries of ZoneAvoidance and AvailabilityFiltering follow the
// weights, zone draws weigh a zone by the sum of its alive servers'
// weights, and BestAvailable and LeastRequest compare active requests per
// weight. The tables are built with each snapshot; a view whose servers all
// weigh the same has none and takes the unweighted paths unchanged.
//
// # Subsets and hints
//
// A request can be confined to the instances whose metadata match a
// [Selector] ("version=v2"): [WithSubset] with a [Subset] and Envoy's
// fallback policies (any instance, a default subset, or none: an error
// matching [ErrNoSubset] and ErrNoServers), and [WithHint], Spring Cloud
// LoadBalancer's hint (metadata "hint", every instance when none has it).
// A subset is a snapshot of its own over the parent's servers, indexed per
// key set on list change: statistics and breakers are shared, and the
// zone choice and the rule apply inside it. See subset.go.
// # Slow start
//
// With Config.SlowStart (a window; off by default), a server new to the
// list, or listed again with another Server.Incarnation, ramps its weight
// from MinWeightPercent (10 %) to full over the window on Envoy's
// slow_start_config curve (Dubbo's warm-up): its weight is scaled by
// max(MinWeightPercent/100, (max(t, 1 s)/window)^(1/Aggression)), t the
// time since it was listed. Every rule that weighs servers follows (not
// the keyed ones, Maglev and Rendezvous). The servers of a balancer's
// first non-empty list do not ramp (a gateway's cold start). The live
// weights are built into the snapshot and recomputed (every window/20, at
// least 1 s) off the request path by a goroutine of the balancer that runs
// only while a server ramps and stops with Close; a pick when nothing
// ramps pays one nil check (slowstart.go).
//
// # Lifecycle
//
// [New] builds a balancer and starts nothing; [Balancer.Start] starts its
// ping loop and polling updater, if the configuration has any, and
// [Balancer.Close] stops them, and the slow-start refresher, which a list
// change starts while a server ramps. [Balancer.StopPolling] hands the list over
// to the push path for good. A [Factory] builds a balancer per client name
// on first [Factory.Get] and starts it; its Close closes them all.
// [Balancers] is the one interface callers (lbhttp, lbvisitor) find
// balancers through.
//
// # Configuration
//
// [Config] holds one client's settings and [DefaultConfig] Ribbon's and
// Spring Cloud's defaults; [ClientsConfig] holds the defaults and every
// named client's settings, and [Factory] builds a balancer per client from
// it. This package does not read files: package
// github.com/pushlb/pushlb/balancer/lbconfig loads a ClientsConfig from
// YAML or from a Ribbon .properties file.
//
// # Threading
//
// Choose, Pick, Begin, the Pick's methods and the stats accessors may be
// called from any number of goroutines at any time, including after
// Close. List changes are serialised inside the balancer; callers may issue
// them from any goroutine. Listeners are called after the change, outside
// any lock, from the goroutine that made the change.
package balancer
