// Package balancer is pushlb's load-balancing core: Netflix Ribbon's model
// (rules, zone filters, per-server stats with a circuit breaker, zone
// awareness, ping, list updaters, per-client configuration) done the Go way.
//
// # Model
//
// A [Balancer] balances over the servers of one service. Every list change
// (SetServers, AddServers, MarkServerDown, a ping round) builds a new
// immutable [Snapshot] and swaps it in through an atomic pointer, as grpc-go
// regenerates its picker. [Balancer.Choose] reads the current snapshot without
// taking a lock, and for the simple rules without allocating.
//
// Per-server statistics ([ServerStats]: active requests, response time,
// successive connection failures and the circuit breaker built on them) are
// keyed by instance ID, so they survive snapshot swaps: a server that stays in
// the list keeps its numbers.
//
// A pick goes through three steps:
//
//  1. The zone scope: a zone forced with [WithZone] when it has a usable
//     server, else the [ZoneFilter] (ZoneAffinity, ZonePreference or none)
//     narrows the candidates to the client's zone or leaves all of them.
//  2. Zone awareness: with more than one zone in scope, zones that are
//     blacked out or overloaded are avoided as Ribbon's ZoneAwareLoadBalancer
//     does, and one zone is picked at random weighted by its instance count.
//  3. The [Rule] (RoundRobin, Random, WeightedResponseTime, BestAvailable,
//     AvailabilityFiltering, ZoneAvoidance, Retry, Rendezvous) picks a server
//     from the resulting [View].
//
// Zone statistics (instance count, tripped count, active requests, load per
// server) are cached per zone and refreshed at most every
// Config.ZoneStatsInterval or at once when a circuit breaker changes state,
// so zone-aware picks stay O(zones), not O(servers).
//
// Ribbon applies its server-list filter only when the list is polled, so with
// push updates (no polling) a zone-affinity filter would never revisit its
// decision. pushlb evaluates the zone filter on every pick from the cached
// zone statistics instead: the decision follows load and failures as they
// happen.
//
// # Threading
//
// Choose and the stats API may be called from any number of goroutines at any
// time. List changes are serialised inside the balancer; callers may issue
// them from any goroutine. Listeners are called after the change, outside any
// lock, from the goroutine that made the change.
package balancer
