package subscriber

import (
	"encoding/json"
	"errors"
	"sync/atomic"

	"github.com/pushlb/pushlb/events"
)

// DropReason is why the subscriber dropped a message. Its String is the
// metric label.
type DropReason uint8

// The drop reasons, as counted in Stats.Dropped.
const (
	DropMalformed    DropReason = iota // not a valid JSON object, wrong types
	DropTooLarge                       // above events.MaxPayloadSize
	DropBadSubject                     // subject not <prefix>.svc.<service>.online|offline
	DropInvalid                        // missing or invalid field, bad service name or ID
	DropMismatch                       // payload disagrees with its subject
	DropVersion                        // unsupported format version
	DropStale                          // lower incarnation than known, or online after offline
	DropDuplicate                      // already known
	DropUnsubscribed                   // a service this subscriber does not follow
	DropFuture                         // incarnation beyond the clock + events.MaxIncarnationAhead
	DropLimit                          // a new instance beyond the limits on unconfirmed instances, services or instances per service
	DropOtherRegion                    // an event of an instance of another region than Config.Region

	numDropReasons // the number of reasons; not a reason
)

var dropReasonNames = [numDropReasons]string{
	DropMalformed:    "malformed",
	DropTooLarge:     "too_large",
	DropBadSubject:   "bad_subject",
	DropInvalid:      "invalid",
	DropMismatch:     "mismatch",
	DropVersion:      "version",
	DropStale:        "stale",
	DropDuplicate:    "duplicate",
	DropUnsubscribed: "unsubscribed",
	DropFuture:       "future",
	DropLimit:        "limit",
	DropOtherRegion:  "other_region",
}

// String returns the reason's metric label ("malformed", "too_large",
// "bad_subject", "invalid", "mismatch", "version", "stale", "duplicate",
// "unsubscribed", "future", "limit", "other_region"), or "unknown" for a
// value that is not a reason.
func (r DropReason) String() string {
	if r >= numDropReasons {
		return "unknown"
	}
	return dropReasonNames[r]
}

// AllDropReasons returns every reason, in order, for metrics that
// pre-declare their labels. The slice is the caller's.
func AllDropReasons() []DropReason {
	out := make([]DropReason, numDropReasons)
	for i := range out {
		out[i] = DropReason(i)
	}
	return out
}

// DropCounts counts dropped messages per reason: d[DropStale] is the number
// of stale events. It is a copy taken by Stats; changing it changes nothing
// in the subscriber. It encodes to JSON as an object keyed by the reasons'
// labels, {"malformed": 0, "too_large": 0, ...}.
type DropCounts [numDropReasons]uint64

// Total returns the number of dropped messages, whatever the reason.
func (d DropCounts) Total() uint64 {
	var n uint64
	for _, c := range d {
		n += c
	}
	return n
}

// MarshalJSON implements json.Marshaler.
func (d DropCounts) MarshalJSON() ([]byte, error) {
	m := make(map[string]uint64, len(d))
	for r, c := range d {
		m[DropReason(r).String()] = c
	}
	return json.Marshal(m)
}

// Stats are counters since the subscriber was built.
type Stats struct {
	// Received counts messages received on the change subjects. A message
	// is counted once it has been handled (applied to the membership, or
	// dropped and counted in Dropped), so Received reaching n proves that
	// the first n messages were processed.
	Received uint64 `json:"received"`
	// Applied counts events that changed a live set.
	Applied uint64 `json:"applied"`
	// Dropped counts dropped messages by reason.
	Dropped DropCounts `json:"dropped"`
	// Delivered counts ListChanged calls made to the handler, each counted
	// once the call has returned; HandlerErrors those that returned an
	// error (and were retried).
	Delivered     uint64 `json:"delivered"`
	HandlerErrors uint64 `json:"handlerErrors"`
	// Reconciles counts reconciliations of a service with the registry;
	// RegistryRemovals the instances they took offline (deleted or expired
	// entries).
	Reconciles       uint64 `json:"reconciles"`
	RegistryRemovals uint64 `json:"registryRemovals"`
	// RegistryRevivals counts instances a registry write brought back after
	// an offline event or a gossip death recorded before it: a forged
	// offline undone by the instance's next lease refresh, or an instance
	// that re-asserted its record.
	RegistryRevivals uint64 `json:"registryRevivals"`
	// LeaseProbes counts the lease probes that ended (see leaseprobe.go),
	// LeaseProbeReads the registry reads they made: a withdrawal's probe
	// ends without one.
	LeaseProbes     uint64 `json:"leaseProbes"`
	LeaseProbeReads uint64 `json:"leaseProbeReads"`
	// GossipRemovals counts instances taken offline because gossip declared
	// them dead or gone; GossipRevivals those it brought back.
	GossipRemovals uint64 `json:"gossipRemovals"`
	GossipRevivals uint64 `json:"gossipRevivals"`
	// GossipIgnored counts the gossip reports (deaths, leaves, revivals)
	// GossipHandler ignored because they came from a node other than the
	// one the instance's registry record names, or the record names none.
	GossipIgnored uint64 `json:"gossipIgnored"`
	// OfflineRemovals counts instances an offline event took out of a live
	// set: withdrawals (and forged offlines).
	OfflineRemovals uint64 `json:"offlineRemovals"`
	// Advisories counts the client-disconnect advisories, the probes they
	// started and the instances removed (Config.AdvisorySubject).
	Advisories AdvisoryStats `json:"advisories"`
	// Unconfirmed counts instances known only from events (or gossip) that
	// were forgotten because the registry did not show them within
	// Config.ConfirmWithin: announcements of instances nobody registered.
	Unconfirmed uint64 `json:"unconfirmed"`
	// Follows and Unfollows count the services a scoped subscriber began
	// and stopped following (Follow, Unfollow); Followed is how many it
	// follows now (Config.Services included), 0 for one that follows
	// every service.
	Follows   uint64 `json:"follows"`
	Unfollows uint64 `json:"unfollows"`
	Followed  int    `json:"followed"`
}

type counters struct {
	received, applied, delivered, handlerErrors atomic.Uint64
	reconciles, registryRemovals                atomic.Uint64
	registryRevivals                            atomic.Uint64
	leaseProbes, leaseProbeReads                atomic.Uint64
	gossipRemovals, gossipRevivals              atomic.Uint64
	unconfirmed, offlineRemovals                atomic.Uint64
	follows, unfollows                          atomic.Uint64
	dropped                                     [numDropReasons]atomic.Uint64
}

func (c *counters) drop(reason DropReason) { c.dropped[reason].Add(1) }

func (c *counters) snapshot() Stats {
	s := Stats{
		Received:         c.received.Load(),
		Applied:          c.applied.Load(),
		Delivered:        c.delivered.Load(),
		HandlerErrors:    c.handlerErrors.Load(),
		Reconciles:       c.reconciles.Load(),
		RegistryRemovals: c.registryRemovals.Load(),
		RegistryRevivals: c.registryRevivals.Load(),
		LeaseProbes:      c.leaseProbes.Load(),
		LeaseProbeReads:  c.leaseProbeReads.Load(),
		GossipRemovals:   c.gossipRemovals.Load(),
		GossipRevivals:   c.gossipRevivals.Load(),
		Unconfirmed:      c.unconfirmed.Load(),
		OfflineRemovals:  c.offlineRemovals.Load(),
		Follows:          c.follows.Load(),
		Unfollows:        c.unfollows.Load(),
	}
	for i := range c.dropped {
		s.Dropped[i] = c.dropped[i].Load()
	}
	return s
}

// dropReason classifies a decoding error.
func dropReason(err error) DropReason {
	switch {
	case errors.Is(err, events.ErrTooLarge):
		return DropTooLarge
	case errors.Is(err, events.ErrBadSubject):
		return DropBadSubject
	case errors.Is(err, events.ErrMismatch):
		return DropMismatch
	case errors.Is(err, events.ErrUnsupportedVersion):
		return DropVersion
	case errors.Is(err, events.ErrMalformed):
		return DropMalformed
	}
	return DropInvalid
}
