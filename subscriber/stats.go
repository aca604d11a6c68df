package subscriber

import (
	"errors"
	"sync/atomic"

	"github.com/pushlb/pushlb/events"
)

// Drop reasons, as counted in Stats.Dropped and exported as metric labels.
const (
	DropMalformed    = "malformed"    // not a valid JSON object, wrong types
	DropTooLarge     = "too_large"    // above events.MaxPayloadSize
	DropBadSubject   = "bad_subject"  // subject not <prefix>.svc.<service>.online|offline
	DropInvalid      = "invalid"      // missing or invalid field, bad service name or ID
	DropMismatch     = "mismatch"     // payload disagrees with its subject
	DropVersion      = "version"      // unsupported format version
	DropStale        = "stale"        // lower incarnation than known, or online after offline
	DropDuplicate    = "duplicate"    // already known
	DropUnsubscribed = "unsubscribed" // a service this subscriber does not follow
)

// DropReasons lists every reason, for metrics that pre-declare labels.
var DropReasons = []string{DropMalformed, DropTooLarge, DropBadSubject, DropInvalid,
	DropMismatch, DropVersion, DropStale, DropDuplicate, DropUnsubscribed}

// Stats are counters since the subscriber was built.
type Stats struct {
	// Received counts messages received on the change subjects.
	Received uint64
	// Applied counts events that changed a live set.
	Applied uint64
	// Dropped counts dropped messages by reason (the Drop constants).
	Dropped map[string]uint64
	// Delivered counts ListChanged calls made to the handler; HandlerErrors
	// those that returned an error (and were retried).
	Delivered, HandlerErrors uint64
	// Reconciles counts reconciliations of a service with the registry;
	// RegistryRemovals the instances they took offline (deleted or expired
	// entries).
	Reconciles, RegistryRemovals uint64
	// GossipRemovals counts instances taken offline because gossip declared
	// them dead or gone; GossipRevivals those it brought back.
	GossipRemovals, GossipRevivals uint64
}

type counters struct {
	received, applied, delivered, handlerErrors atomic.Uint64
	reconciles, registryRemovals                atomic.Uint64
	gossipRemovals, gossipRevivals              atomic.Uint64
	dropped                                     [9]atomic.Uint64 // indexed like DropReasons
}

func (c *counters) drop(reason string) {
	for i, r := range DropReasons {
		if r == reason {
			c.dropped[i].Add(1)
			return
		}
	}
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Received:         c.received.Load(),
		Applied:          c.applied.Load(),
		Delivered:        c.delivered.Load(),
		HandlerErrors:    c.handlerErrors.Load(),
		Reconciles:       c.reconciles.Load(),
		RegistryRemovals: c.registryRemovals.Load(),
		GossipRemovals:   c.gossipRemovals.Load(),
		GossipRevivals:   c.gossipRevivals.Load(),
		Dropped:          make(map[string]uint64, len(DropReasons)),
	}
	for i, r := range DropReasons {
		s.Dropped[r] = c.dropped[i].Load()
	}
	return s
}

// dropReason classifies a decoding error.
func dropReason(err error) string {
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
