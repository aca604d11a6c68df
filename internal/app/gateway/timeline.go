package gateway

import (
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/events"
)

// timelineSize is how many list changes /-/lb keeps.
const timelineSize = 100

// The sources of a list change, as the timeline names them.
const (
	SourceEvent    = "event"    // an online or offline event on the bus
	SourceAdvisory = "advisory" // the NATS server's advisory that the instance's connection ended, confirmed by a probe (a crash)
	SourceGossip   = "gossip"   // gossip declared the instance dead, gone or back
	SourceRegistry = "registry" // the registry mirror: a new record, a deletion or an expired lease
	SourceResync   = "resync"   // a full resynchronisation of the mirror (start, reconnect)
	SourceConfig   = "config"   // a static listOfServers in the balancer configuration
)

// TimelineEntry is one entry of /-/lb's timeline: an instance that joined
// or left a service's list. The client reports a change of a list as one
// pushlb.ListChange; the timeline keeps one entry per instance in it.
type TimelineEntry struct {
	// Seq numbers the changes from 1, in the order the gateway saw them.
	Seq uint64 `json:"seq"`
	// At is when the gateway's balancer applied the change.
	At       time.Time `json:"at"`
	Service  string    `json:"service"`
	Instance string    `json:"instance"`
	Addr     string    `json:"addr"`
	// Change is "online" or "offline".
	Change string `json:"change"`
	// Source is what caused it: event, advisory (a crash the NATS server
	// reported, confirmed by a probe), gossip, registry (a record written,
	// deleted or expired), resync, config (pushlb.ServerChange.Cause).
	Source string `json:"source"`
	// LagMs is the time from the event's creation (its at field, the
	// announcer's clock) to the change, for changes caused by an event.
	LagMs *float64 `json:"lagMs,omitempty"`
}

// sources name the causes of list changes as the timeline does.
var sources = map[events.Cause]string{
	events.CauseAnnounce: SourceEvent, events.CauseOffline: SourceEvent,
	events.CauseAdvisory: SourceAdvisory,
	events.CauseGossip:   SourceGossip, events.CauseRegistry: SourceRegistry,
	events.CauseResync: SourceResync, events.CauseConfig: SourceConfig,
}

// observe is the client's list observer: it records who joined and left,
// and why, as the client reports it.
func (d *dashboard) observe(lc pushlb.ListChange) {
	d.mu.Lock()
	for _, c := range lc.Joined {
		d.recordLocked(lc, c, true)
	}
	for _, c := range lc.Left {
		d.recordLocked(lc, c, false)
	}
	d.dirty[lc.Service] = struct{}{}
	d.mu.Unlock()
	d.poke()
}

func (d *dashboard) recordLocked(lc pushlb.ListChange, sc pushlb.ServerChange, online bool) {
	d.seq++
	c := TimelineEntry{Seq: d.seq, At: lc.At, Service: lc.Service, Instance: sc.Server.ID, Addr: sc.Server.Addr(),
		Change: "offline", Source: sources[sc.Cause]}
	if online {
		c.Change = "online"
	}
	if !sc.EventAt.IsZero() {
		lag := float64(lc.At.Sub(sc.EventAt).Microseconds()) / 1000
		c.LagMs = &lag
	}
	if len(d.timeline) < timelineSize {
		d.timeline = append(d.timeline, c)
	} else {
		copy(d.timeline, d.timeline[1:])
		d.timeline[len(d.timeline)-1] = c
	}
}

// Timeline returns the recent list changes, oldest first.
func (d *dashboard) Timeline() []TimelineEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append(make([]TimelineEntry, 0, len(d.timeline)), d.timeline...) // [] in JSON when empty, not null
}
