package events

import (
	"maps"
	"slices"
	"time"
)

// ListChanged tells that the set of live instances of one service changed.
// It is internal to a gateway: the subscriber's membership table emits it,
// and balancer visitors apply it.
//
// It always carries the full list of live instance IDs, never a delta, so a
// listener that missed one ListChanged is put right by the next, and a new
// listener needs only the latest. An empty InstanceIDs means the membership
// knows the service has no live instance.
//
// Revision grows with every change of the service's list as the emitter sees
// it; a listener may drop a ListChanged whose Revision is not greater than
// the last it applied. Emitters hand out a fresh InstanceIDs slice that
// listeners must not modify; use Clone to keep a copy that may change.
type ListChanged struct {
	// Service is the service whose list changed.
	Service string
	// InstanceIDs are the IDs of every live instance, in no particular order
	// and without duplicates.
	InstanceIDs []string
	// Revision orders the ListChanged messages of one service.
	Revision uint64
	// Changes says, for each instance that joined or left the live set
	// since the previous ListChanged of the service, why: the latest cause
	// of its change. It is keyed by instance ID; an ID absent from it
	// changed for Cause (or did not change).
	Changes map[string]Change
	// Cause is the cause of the changes Changes has no entry for, when one
	// explains them all: CauseResync for the registry's load at start,
	// which changes every instance at once and so is not recorded per
	// instance. Empty when unknown.
	Cause Cause
}

// Cause is why an instance joined or left a service's live set.
type Cause string

// The causes of a list change.
const (
	// CauseAnnounce is an online event.
	CauseAnnounce Cause = "announce"
	// CauseOffline is an offline event: a withdrawal, or a forged one.
	CauseOffline Cause = "offline"
	// CauseGossip is gossip declaring the instance's node dead or gone (a
	// crash), or back.
	CauseGossip Cause = "gossip"
	// CauseAdvisory is the NATS server's advisory that the instance's
	// connection ended (its process died), confirmed by a probe that found
	// nothing answering at the instance.
	CauseAdvisory Cause = "advisory"
	// CauseRegistry is the registry: a record written before its event
	// arrived, a write that brought an instance back, or a record removed
	// without an offline event first (by the reaper when its lease ended,
	// or by an operator).
	CauseRegistry Cause = "registry"
	// CauseResync is a full load of the registry (start, reconnect).
	CauseResync Cause = "resync"
	// CauseConfig is a static list in the balancer configuration.
	CauseConfig Cause = "config"
)

// Change is the cause of one instance's change, and for CauseAnnounce and
// CauseOffline the event's At (the announcer's clock).
type Change struct {
	Cause   Cause
	EventAt time.Time
}

// Equal reports whether l and o name the same service and the same set of
// instance IDs, ignoring order, duplicates, Revision and Changes. Emitters use it to
// drop an update that changes nothing.
func (l ListChanged) Equal(o ListChanged) bool {
	if l.Service != o.Service {
		return false
	}
	return slices.Equal(sortedSet(l.InstanceIDs), sortedSet(o.InstanceIDs))
}

// Clone returns a copy of l that shares no memory with it.
func (l ListChanged) Clone() ListChanged {
	l.InstanceIDs = slices.Clone(l.InstanceIDs)
	l.Changes = maps.Clone(l.Changes)
	return l
}

// sortedSet returns ids sorted without duplicates, copying only when ids is
// not so already (the common case for emitters that sort).
func sortedSet(ids []string) []string {
	for i := 1; i < len(ids); i++ {
		if ids[i-1] >= ids[i] {
			return slices.Compact(slices.Sorted(slices.Values(ids)))
		}
	}
	return ids
}
