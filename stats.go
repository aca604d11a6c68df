package pushlb

import (
	"github.com/pushlb/pushlb/serverlist"
	"slices"
	"strings"
	"time"

	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/subscriber"
)

// Stats are the client's counters and the state of its balancers. The
// counters run from Start; they are zero before it. The types are this
// package's own, so that the subpackages may change theirs; the JSON keys
// are the gateway's /-/lb keys (docs/config.md).
type Stats struct {
	// Started reports whether Start succeeded and Close was not called.
	Started bool `json:"started"`
	// Events counts what the change subjects brought.
	Events EventStats `json:"subscriber"`
	// Registry describes the local mirror of the registry.
	Registry RegistryStats `json:"mirror"`
	// Lookups counts instance-ID lookups by result.
	Lookups LookupStats `json:"lookups"`
	// Gossip describes the client's gossip node; zero with gossip off.
	Gossip GossipStats `json:"gossip"`
	// Advisories describes crash detection by client-disconnect
	// advisories (Config.Advisories).
	Advisories AdvisoryStats `json:"advisories"`
	// Reaper describes this client's part in the registry's reaper
	// election (Config.Reaper); zero without it.
	Reaper ReaperStats `json:"reaper"`
	// Services holds one entry per balancer, sorted by name.
	Services []ServiceStats `json:"services"`
	// Unregistered counts the lists of services without a balancer that
	// named no registered instance, and so built nothing (announcements
	// for invented services).
	Unregistered uint64 `json:"unregistered"`
	// ListsHeld counts the lists held back because the registry lost
	// every instance of their service at once (Config.EmptyListHold).
	ListsHeld uint64 `json:"listsHeld"`
	// ServicesRemoved counts the balancers removed because their service
	// had no instance and no request for Config.ServiceGrace, or, followed
	// on request, no request for Config.IdleUnfollow.
	ServicesRemoved uint64 `json:"servicesRemoved"`
	// Follow describes what the client follows (Config.Follow).
	Follow FollowStats `json:"follow"`
	// Failover counts the probes of the registry through the client's
	// NATS server and the moves to another server of its cluster that
	// they caused (docs/reliability.md); zero for a connection that knows
	// one server.
	Failover FailoverStats `json:"failover"`
	// Regions are the other regions whose records the registry holds
	// copies of, as their status keys say (docs/multiregion.md): Stale
	// when the link to one is cut or no replicator writes its status.
	// Empty without Config.Region.
	Regions []serverlist.RegionView `json:"regions,omitempty"`
	// Replication describes this client's copying of other regions'
	// records (Config.RemoteRegions), while its reaper leads; zero
	// without it.
	Replication serverlist.ReplicatorStats `json:"replication"`
}

// FailoverStats count the client's probes of the registry stream through
// its NATS server (one per ping interval while the connection knows more
// than one server): Answered by a leader with a quorum of the stream's
// replicas (or with an error that is an answer: a permission, a lost
// bucket), Unanswered, and Moves to another server of the cluster after
// unanswered probes in a row.
type FailoverStats struct {
	Answered   uint64 `json:"answered"`
	Unanswered uint64 `json:"unanswered"`
	Moves      uint64 `json:"moves"`
}

// FollowStats describe what a client follows and its follows on request.
type FollowStats struct {
	// Mode is Config.Follow: "all", "listed" or "requested".
	Mode string `json:"mode"`
	// Followed is the number of services a scoped client (listed,
	// requested) follows now: subscribed to and mirrored. 0 for "all".
	Followed int `json:"followed"`
	// Follows counts the services followed on request and routed;
	// NotFound the requested services the registry did not hold; Failed
	// the follows that failed or timed out; Busy the requests answered
	// unknown because 64 follows were under way; NegativeHits the requests
	// answered from the memory (2 s) of a service found absent; Following
	// the follows under way now.
	Follows      uint64 `json:"follows"`
	NotFound     uint64 `json:"notFound"`
	Failed       uint64 `json:"failed"`
	Busy         uint64 `json:"busy"`
	NegativeHits uint64 `json:"negativeHits"`
	Following    int    `json:"following"`
	// Unfollows counts the services a scoped client stopped following
	// once routed (no request for Config.IdleUnfollow, or gone from the
	// registry for Config.ServiceGrace); 0 for "all".
	Unfollows uint64 `json:"unfollows"`
}

// EventStats count the messages of the change subjects and what they did.
type EventStats struct {
	// Received counts messages received; a message is counted once
	// handled (applied, or dropped and counted in Dropped).
	Received uint64 `json:"received"`
	// Applied counts events that changed a live set.
	Applied uint64 `json:"applied"`
	// Dropped counts dropped messages by reason, keyed by the metric label
	// of pushlb_events_dropped_total ("malformed", "stale", "limit", ...;
	// docs/config.md lists them). Every reason is present.
	Dropped map[string]uint64 `json:"dropped"`
	// Delivered counts the lists handed to the balancers; HandlerErrors
	// those that failed (and were retried).
	Delivered     uint64 `json:"delivered"`
	HandlerErrors uint64 `json:"handlerErrors"`
	// Reconciles counts reconciliations of a service with the registry;
	// RegistryRemovals the instances they took out (removed records).
	Reconciles       uint64 `json:"reconciles"`
	RegistryRemovals uint64 `json:"registryRemovals"`
	// RegistryRevivals counts instances a registry write brought back after
	// an offline event or a gossip death (a forged offline undone).
	RegistryRevivals uint64 `json:"registryRevivals"`
	// LeaseProbes counts the lease probes that ended (an offline event for
	// an instance whose record stayed), LeaseProbeReads their reads.
	LeaseProbes     uint64 `json:"leaseProbes"`
	LeaseProbeReads uint64 `json:"leaseProbeReads"`
	// OfflineRemovals counts instances an offline event took out: graceful
	// withdrawals.
	OfflineRemovals uint64 `json:"offlineRemovals"`
	// GossipRemovals and GossipRevivals count instances gossip took out
	// and brought back.
	GossipRemovals uint64 `json:"gossipRemovals"`
	GossipRevivals uint64 `json:"gossipRevivals"`
	// Unconfirmed counts instances known only from events that the
	// registry did not show within Limits.ConfirmWithin, and were
	// forgotten.
	Unconfirmed uint64 `json:"unconfirmed"`
}

// RegistryStats describe the client's mirror of the registry.
type RegistryStats struct {
	// Instances is the number of records held.
	Instances int `json:"instances"`
	// Puts and Removals count the record writes and removals seen.
	Puts     uint64 `json:"puts"`
	Removals uint64 `json:"removals"`
	// MalformedKeys and MalformedValues count the records skipped.
	MalformedKeys   uint64 `json:"malformedKeys"`
	MalformedValues uint64 `json:"malformedValues"`
	// Collisions counts copies of another region's records skipped
	// because this region's own record holds the same ID.
	Collisions uint64 `json:"collisions,omitempty"`
	// Syncs counts the full loads (start, reconnect); WatchErrors the
	// watches that failed and were restarted.
	Syncs       uint64 `json:"syncs"`
	WatchErrors uint64 `json:"watchErrors"`
	// Refreshes counts the writes of records that carry their own lease
	// (renewals reaching the mirror).
	Refreshes uint64 `json:"refreshes"`
	// BucketsRecreated counts the times the bucket was gone and was made
	// again.
	BucketsRecreated uint64 `json:"bucketsRecreated"`
	// WentBack counts the times the bucket came back with an older state
	// than the mirror had applied (a server or cluster that lost
	// acknowledged writes; docs/reliability.md).
	WentBack uint64 `json:"wentBack"`
	// Revision is the registry revision the mirror reflects.
	Revision uint64 `json:"revision"`
}

// LookupStats count instance-ID lookups by result.
type LookupStats struct {
	// Hits are lookups the mirror served; Misses those it could not at
	// once, of which Fallbacks resolved later (a registry read, or the
	// mirror catching up) and Failures did not.
	Hits      uint64 `json:"hits"`
	Misses    uint64 `json:"misses"`
	Fallbacks uint64 `json:"fallbacks"`
	Failures  uint64 `json:"failures"`
	// RegistryReads counts the registry reads of the misses.
	RegistryReads uint64 `json:"registryReads"`
	// NegativeHits and RateLimited count misses answered not found without
	// a read: found absent recently, or the read budget spent.
	NegativeHits uint64 `json:"negativeHits"`
	RateLimited  uint64 `json:"rateLimited"`
}

// GossipStats describe the client's gossip node.
type GossipStats struct {
	// Members is the number of members the node sees, itself included.
	Members int `json:"members"`
	// Ignored counts reports (deaths, leaves, revivals) ignored because
	// they came from a node other than the one the instance's registry
	// record names: spoofing attempts, or publishers that do not record
	// their gossip node.
	Ignored uint64 `json:"ignored"`
}

// AdvisoryStats describe crash detection by client-disconnect advisories.
type AdvisoryStats struct {
	// State says whether advisories arrive: "off" (Config.Advisories.Off,
	// or before Start), "checking" (Start's check runs), "on", "missing"
	// (the check's advisory did not come: crashes are left to gossip and
	// leases; an advisory arriving later turns it "on").
	State string `json:"state"`
	// Received counts the messages on the advisory subject; Malformed those
	// that were not advisories; Matched the advisories that named an
	// instance's connection; Skipped those not probed (a probe of the
	// instance ran already, or too many ran).
	Received  uint64 `json:"received"`
	Malformed uint64 `json:"malformed"`
	Matched   uint64 `json:"matched"`
	Skipped   uint64 `json:"skipped"`
	// Probes counts the probes that ended by outcome: "alive" (kept),
	// "refused", "unreachable" (removed). Every outcome is present.
	Probes map[string]uint64 `json:"probes"`
	// Removals counts the instances removed after a probe found them dead.
	Removals uint64 `json:"removals"`
	// Releases counts, while this client's reaper leads, the IDs of
	// instances found dead that it freed for their restart, by outcome:
	// "released" (lease ended, record removed), "renamed" (the record
	// names another connection now, or is gone), "renewed" (the lease was
	// renewed after the close: the holder lives), "failed". Every outcome
	// is present.
	Releases map[string]uint64 `json:"releases"`
}

// ReaperStats describe the client's part in the reaper election.
type ReaperStats struct {
	// Leader reports whether this client reaps now; Terms counts the
	// times it took the lead.
	Leader bool   `json:"leader"`
	Terms  uint64 `json:"terms"`
	// LeasesEnded counts the lease ends seen while leading; Reaped the
	// records removed; Sweeps the sweeps for records without a lease,
	// MirroredSweeps those that took the records from the client's mirror
	// instead of listing them; Errors the failed watches, reads and
	// removals.
	LeasesEnded    uint64 `json:"leasesEnded"`
	Reaped         uint64 `json:"reaped"`
	Sweeps         uint64 `json:"sweeps"`
	MirroredSweeps uint64 `json:"mirroredSweeps"`
	Errors         uint64 `json:"errors"`
	// NotPermitted reports that the NATS user may not write the reaper's
	// lock; Unled, for such a client, that no reaper has led for more than
	// a lease (crashed instances are not being removed).
	NotPermitted bool `json:"notPermitted"`
	Unled        bool `json:"unled"`
}

// ServiceStats summarises one service's balancer.
type ServiceStats struct {
	Name string `json:"name"`
	// Servers is the number of listed servers; Reachable those a pick may
	// choose: alive, with a closed circuit breaker.
	Servers   int `json:"servers"`
	Reachable int `json:"reachable"`
	// Updates counts the changes of the server list.
	Updates uint64 `json:"updates"`
	// Revision is the registry revision the client has applied to the
	// service's list: a change written at revision r (Registry.Register
	// returns it) has reached the list once Revision is r or more. Zero
	// before the service's first list.
	Revision uint64 `json:"revision"`
	// Digest sums the list's instances (their IDs and incarnations): two
	// clients with the same Digest route the same instances, whatever
	// their Revisions. Empty before the service's first list.
	Digest string `json:"digest,omitempty"`
	// LastChange is the time of the last list change; zero before the first.
	LastChange time.Time `json:"lastChange"`
	// BreakerTrips counts the circuit breakers that tripped.
	BreakerTrips uint64 `json:"breakerTrips"`
	// Ejected is the number of servers outlier detection ejects now;
	// Ejections counts ejections since the balancer was built
	// (balancer.Config.OutlierDetection).
	Ejected   int    `json:"ejected"`
	Ejections uint64 `json:"ejections"`
	// Panic reports that too few of the service's servers are healthy
	// (balancer.Config.PanicThreshold): picks balance over all of them.
	Panic bool `json:"panic"`
	// Held reports that the service's last list is kept although the
	// registry lost its instances at once (Config.EmptyListHold).
	Held bool `json:"held"`
}

// ServiceStats returns one service's summary, as Stats lists it; false
// when the client has no balancer for the service. It costs one pass over
// the service's servers.
func (c *Client) ServiceStats(name string) (ServiceStats, bool) {
	sv := c.services.Lookup(name)
	if sv == nil {
		return ServiceStats{}, false
	}
	return c.serviceStats(sv), true
}

// serviceStats is sv's summary.
func (c *Client) serviceStats(sv *lbvisitor.Service) ServiceStats {
	b := sv.Balancer()
	ss := ServiceStats{
		Name: sv.Name(), Servers: len(b.AllServers()), Updates: sv.Updates(), LastChange: sv.LastChange(),
		BreakerTrips: b.BreakerTrips(), Ejections: b.Ejections(), Panic: b.Panicking(),
		Held: c.guard.Held(sv.Name()),
	}
	ss.Reachable, ss.Ejected = Balancer{b}.reachable()
	if p := c.started(); p != nil {
		a := p.sub.Applied(sv.Name())
		ss.Revision, ss.Digest = a.Revision, a.Digest
	}
	return ss
}

// Stats returns the current counters and balancer states. It reads each
// component's own counters, so it costs one pass over the services.
func (c *Client) Stats() Stats {
	st := Stats{Events: eventStats(subscriber.Stats{}), Advisories: advisoryStats(subscriber.AdvisoryStats{})}
	if p := c.started(); p != nil {
		st.Started = true
		sub := p.sub.Stats()
		st.Events = eventStats(sub)
		st.Advisories = advisoryStats(sub.Advisories)
		// Conversions between structs of the same fields: a subpackage
		// that changes its type breaks the build here, so the root's types
		// change on purpose or not at all.
		st.Registry = RegistryStats(p.sub.Mirror().Stats())
		st.Lookups = LookupStats(p.lookup.Stats())
		if p.gossip != nil {
			st.Gossip = GossipStats{Members: p.gossip.NumMembers(), Ignored: sub.GossipIgnored}
		}
		if p.reaper != nil {
			st.Reaper = ReaperStats(p.reaper.Stats())
		}
		st.Follow.Followed = sub.Followed
		if p.failover != nil {
			st.Failover = p.failover.stats()
		}
		if p.regions != nil {
			st.Regions = p.regions.Regions()
		}
		if p.replicator != nil {
			st.Replication = p.replicator.Stats()
		}
	}
	fs := c.services.FollowStats()
	st.Follow.Mode = string(c.opts.Follow)
	st.Follow.Follows, st.Follow.NotFound, st.Follow.Failed = fs.Follows, fs.NotFound, fs.Failed
	st.Follow.Busy, st.Follow.NegativeHits, st.Follow.Following = fs.Busy, fs.NegativeHits, fs.Following
	if c.opts.Follow != FollowAll {
		st.Follow.Unfollows = fs.Unfollows
	}
	st.Unregistered = c.services.Unregistered()
	st.ServicesRemoved = c.services.Removed()
	st.ListsHeld = c.guard.Holds()
	for sv := range c.services.All() {
		st.Services = append(st.Services, c.serviceStats(sv))
	}
	slices.SortFunc(st.Services, func(a, b ServiceStats) int { return strings.Compare(a.Name, b.Name) })
	return st
}

// eventStats converts the subscriber's counters.
func eventStats(s subscriber.Stats) EventStats {
	dropped := make(map[string]uint64, len(s.Dropped))
	for _, r := range subscriber.AllDropReasons() {
		dropped[r.String()] = s.Dropped[r]
	}
	return EventStats{
		Received: s.Received, Applied: s.Applied, Dropped: dropped,
		Delivered: s.Delivered, HandlerErrors: s.HandlerErrors,
		Reconciles: s.Reconciles, RegistryRemovals: s.RegistryRemovals, RegistryRevivals: s.RegistryRevivals,
		LeaseProbes: s.LeaseProbes, LeaseProbeReads: s.LeaseProbeReads,
		GossipRemovals: s.GossipRemovals, GossipRevivals: s.GossipRevivals,
		Unconfirmed: s.Unconfirmed, OfflineRemovals: s.OfflineRemovals,
	}
}

// advisoryStats converts the subscriber's advisory counters.
func advisoryStats(a subscriber.AdvisoryStats) AdvisoryStats {
	probes := make(map[string]uint64, len(subscriber.AllProbeOutcomes()))
	for _, o := range subscriber.AllProbeOutcomes() {
		probes[o.String()] = a.Probes[o.String()]
	}
	state := string(a.State)
	if state == "" {
		state = string(subscriber.AdvisoriesOff)
	}
	releases := make(map[string]uint64, len(subscriber.AllReleaseOutcomes()))
	for _, o := range subscriber.AllReleaseOutcomes() {
		releases[o.String()] = a.Releases[o.String()]
	}
	return AdvisoryStats{
		State: state, Received: a.Received, Malformed: a.Malformed, Matched: a.Matched,
		Skipped: a.Skipped, Probes: probes, Removals: a.Removals, Releases: releases,
	}
}
