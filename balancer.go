package pushlb

import (
	"context"
	"slices"

	"github.com/pushlb/pushlb/balancer"
)

// Balancer is a read-only view of the balancer of one service that a Client
// owns: it picks and it reports, and it cannot change what the pipeline
// owns (the server list, the configuration, the balancer's lifetime). The
// zero value is not usable; Client.Balancer returns views. A view stays
// valid after the client removes the service (it then reads the removed
// balancer's last state). Safe for concurrent use.
//
// Servers it returns are the balancer's own (no copies, so that reading a
// large list costs nothing): read their fields and statistics, do not
// modify them.
type Balancer struct{ b *balancer.Balancer }

// Name returns the service's name.
func (v Balancer) Name() string { return v.b.Name() }

// Config returns a copy of the balancer's configuration.
func (v Balancer) Config() balancer.Config { return v.b.Config() }

// Pick chooses a server for one call with the balancer's rule; report the
// call's outcome through the Pick (Done, Responded, End), which feeds the
// statistics and the circuit breaker. balancer.WithZone and
// balancer.WithKey on ctx steer the choice. It fails with
// balancer.ErrNoServers when no server can be chosen.
func (v Balancer) Pick(ctx context.Context) (balancer.Pick, error) { return v.b.Pick(ctx) }

// Servers returns every listed server, alive or not, in list order.
func (v Balancer) Servers() []*balancer.Server { return v.b.AllServers() }

// Reachable returns the servers a pick may choose: alive, with a closed
// circuit breaker (a tripped server is not reachable until its blackout
// ends) and not ejected by outlier detection. The zone filter may narrow
// a pick further; in panic (balancer.Config.PanicThreshold) a pick may
// choose any alive server. The slice is the caller's.
func (v Balancer) Reachable() []*balancer.Server {
	return slices.DeleteFunc(slices.Clone(v.b.ReachableServers()), unreachable)
}

// Nearest is Reachable over the nearest region that has a reachable
// server (balancer.Config.Region; docs/balancer.md, "Regions"): the
// servers picks choose from now. Without regions it is Reachable. The
// slice is the caller's.
func (v Balancer) Nearest() []*balancer.Server {
	return slices.DeleteFunc(slices.Clone(v.b.NearestServers()), unreachable)
}

// reachable counts the servers Reachable returns, without a copy, and
// those of the others that are ejected.
func (v Balancer) reachable() (reachable, ejected int) {
	for _, s := range v.b.ReachableServers() {
		switch st := s.PeekStats(); {
		case st.Ejected():
			ejected++
		case !st.CircuitTripped():
			reachable++
		}
	}
	return reachable, ejected
}

func unreachable(s *balancer.Server) bool {
	st := s.PeekStats()
	return st.CircuitTripped() || st.Ejected()
}

// Server returns the listed server with id, or nil.
func (v Balancer) Server(id string) *balancer.Server { return v.b.Server(id) }

// ZoneSnapshots returns the statistics of each zone of the list.
func (v Balancer) ZoneSnapshots() map[string]balancer.ZoneSnapshot { return v.b.ZoneSnapshots() }

// BreakerTrips counts the circuit breakers that tripped.
func (v Balancer) BreakerTrips() uint64 { return v.b.BreakerTrips() }
