package lbvisitor

import (
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
)

// ListChange is one change of a service's server list, as a ListObserver
// hears it: who joined, who left, and why each did.
type ListChange struct {
	// Service is the service whose list changed.
	Service string
	// At is when the balancer applied the change.
	At time.Time
	// Joined and Left are the servers that entered and left the list;
	// Updated those that stayed with new details (an address, a weight,
	// a zone, metadata: a record rewritten under the same instance ID).
	Joined, Left, Updated []ServerChange
	// Servers is the list after the change.
	Servers []*balancer.Server
}

// ServerChange is one server that joined or left a list.
type ServerChange struct {
	// Server is the balancer's server (read it, do not modify it).
	Server *balancer.Server
	// Cause is why it joined or left: events.CauseAnnounce or CauseOffline
	// (an event), CauseAdvisory (a crash: the NATS server's advisory that
	// the instance's connection ended, confirmed by a probe),
	// CauseGossip (a crash or a revival seen by gossip),
	// CauseRegistry (a record written before its event, or removed without
	// one: the reaper at a lease's end), CauseResync (the registry loaded
	// at start or after a reconnect), CauseConfig (a static list).
	Cause events.Cause
	// EventAt is the event's time (the announcer's clock) for
	// CauseAnnounce and CauseOffline, else zero: At - EventAt is the
	// propagation lag of the change.
	EventAt time.Time
}

// ListObserver is told of every change of every service's server list.
// Changes of one service arrive one at a time and in order; those of
// different services may arrive concurrently. It runs on the goroutine that
// applies the change, so it must be quick and must not block: hand the
// work to another goroutine. The slices are its own; the servers are the
// balancer's.
type ListObserver func(ListChange)

// pushedChange is the ListChange of a pushed list, lc, that took the
// balancer from old to new: each server changed for the cause lc records
// for it, else for lc's own cause, else because of its registry record.
func pushedChange(lc events.ListChanged, old, new []*balancer.Server) ListChange {
	fallback := events.CauseRegistry
	if lc.Cause != "" {
		fallback = lc.Cause
	}
	return listChange(lc.Service, old, new, lc.Changes, fallback)
}

// configChange is the ListChange of a list the push path did not make: a
// static list of the configuration.
func configChange(service string, old, new []*balancer.Server) ListChange {
	return listChange(service, old, new, nil, events.CauseConfig)
}

// listChange builds the ListChange of a list going from old to new, with
// causes per instance ID and fallback for a server without one.
func listChange(service string, old, new []*balancer.Server, causes map[string]events.Change, fallback events.Cause) ListChange {
	lc := ListChange{Service: service, At: time.Now(), Servers: append([]*balancer.Server(nil), new...)}
	before := make(map[string]*balancer.Server, len(old))
	for _, s := range old {
		before[s.ID] = s
	}
	change := func(s *balancer.Server) ServerChange {
		c, ok := causes[s.ID]
		if !ok {
			c.Cause = fallback
		}
		return ServerChange{Server: s, Cause: c.Cause, EventAt: c.EventAt}
	}
	for _, s := range new {
		switch was, ok := before[s.ID]; {
		case !ok:
			lc.Joined = append(lc.Joined, change(s))
		case was != s:
			// The balancer keeps its copy of an unchanged server: a new
			// one is new details.
			lc.Updated = append(lc.Updated, change(s))
		}
		delete(before, s.ID)
	}
	for _, s := range old {
		if _, ok := before[s.ID]; ok {
			lc.Left = append(lc.Left, change(s))
		}
	}
	return lc
}

// changesLog logs server changes as "id (cause)".
type changesLog []ServerChange

func (c changesLog) MarshalZerologArray(a *zerolog.Array) {
	for _, ch := range c {
		a.Str(ch.Server.ID + " (" + string(ch.Cause) + ")")
	}
}
