package pushlb

import (
	"slices"
	"strings"
	"time"

	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// Stats are the client's counters and the state of its balancers. The
// counters run from Start; they are zero before it.
type Stats struct {
	// Started reports whether Start succeeded and Close was not called.
	Started bool
	// Events are the subscriber's counters: events received, applied and
	// dropped by reason, lists delivered, reconciliations.
	Events subscriber.Stats
	// Registry describes the local mirror of the registry.
	Registry serverlist.MirrorStats
	// Lookups counts instance-ID lookups by result.
	Lookups serverlist.LookupStats
	// GossipMembers is the number of gossip members this node sees, itself
	// included; 0 with gossip off.
	GossipMembers int
	// GossipIgnored counts the gossip reports (deaths, leaves, revivals)
	// ignored because they came from a node other than the one the
	// instance's registry record names, or the record names none: spoofing
	// attempts, or instances whose publisher does not record its gossip
	// node. 0 with gossip off.
	GossipIgnored uint64
	// Reaper describes this client's part in the registry's reaper
	// election (WithReaper); zero without one.
	Reaper serverlist.ReaperStats
	// Services holds one entry per balancer, sorted by name.
	Services []ServiceStats
	// Unregistered counts the lists of services without a balancer that
	// named no registered instance, and so built nothing (announcements
	// for invented services).
	Unregistered uint64
	// ServicesRemoved counts the balancers removed because their service
	// had no instance and no request for the grace period
	// (WithServiceGrace).
	ServicesRemoved uint64
}

// ServiceStats summarises one service's balancer.
type ServiceStats struct {
	Name string
	// Servers is the number of listed servers; Reachable those alive.
	Servers, Reachable int
	// Updates counts the changes of the server list.
	Updates uint64
	// LastChange is the time of the last list change; zero before the first.
	LastChange time.Time
	// BreakerTrips counts the circuit breakers that tripped.
	BreakerTrips uint64
}

// ServiceStats returns one service's summary, as Stats lists it; false
// when the client has no balancer for the service. It costs a map read.
func (c *Client) ServiceStats(name string) (ServiceStats, bool) {
	sv := c.services.lookup(name)
	if sv == nil {
		return ServiceStats{}, false
	}
	return sv.stats(), true
}

func (sv *service) stats() ServiceStats {
	snap := sv.b.Snapshot()
	ss := ServiceStats{
		Name: sv.name, Servers: len(snap.All()), Reachable: len(snap.Reachable()),
		Updates: sv.updates.Load(), BreakerTrips: sv.b.BreakerTrips(),
	}
	if ns := sv.lastChange.Load(); ns != 0 {
		ss.LastChange = time.Unix(0, ns)
	}
	return ss
}

// Stats returns the current counters and balancer states. It reads each
// component's own counters, so it costs one pass over the services.
func (c *Client) Stats() Stats {
	var st Stats
	if p := c.started(); p != nil {
		st.Started = true
		st.Events = p.sub.Stats()
		st.Registry = p.sub.Mirror().Stats()
		st.Lookups = p.lookup.Stats()
		st.Unregistered = p.visitors.Unregistered()
		if p.gossip != nil {
			st.GossipMembers = p.gossip.NumMembers()
			st.GossipIgnored = p.guard.ignored.Load()
		}
		if p.reaper != nil {
			st.Reaper = p.reaper.Stats()
		}
	}
	st.ServicesRemoved = c.removed.Load()
	for _, sv := range c.services.all() {
		st.Services = append(st.Services, sv.stats())
	}
	slices.SortFunc(st.Services, func(a, b ServiceStats) int { return strings.Compare(a.Name, b.Name) })
	return st
}
