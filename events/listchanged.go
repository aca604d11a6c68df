package events

import "slices"

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
}

// Equal reports whether l and o name the same service and the same set of
// instance IDs, ignoring order, duplicates and Revision. Emitters use it to
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
