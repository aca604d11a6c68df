package gateway

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushlb/pushlb/lbhttp"
)

// Dashboard pacing.
const (
	// updateInterval is the least time between two pushed updates (4/s),
	// so that a burst of changes over 1,000 services is one update.
	updateInterval = 250 * time.Millisecond
	// statsInterval is how often the request counters (active requests,
	// response time, breakers) are checked for changes to push.
	statsInterval = 2 * time.Second
	// maxStatsServers bounds the servers whose counters one stats check
	// sends again: beyond it, busy services take turns (in name order, from
	// where the last check stopped), so that 1,000 services under traffic
	// do not resend the whole state every statsInterval. Services with a
	// list change or a failed request are sent at once, outside the bound.
	maxStatsServers = 1000
)

// dashboard keeps the timeline of list changes and pushes updates to the
// /-/lb/events streams. Its hook (observe) runs on the goroutines that
// apply changes: it only records and wakes the loop, which does the work at
// most 4 times a second.
type dashboard struct {
	g          *Gateway
	maxStreams int
	heartbeat  time.Duration
	statsEvery time.Duration // statsInterval; tests shorten it before start
	statsMax   int           // maxStatsServers; tests lower it before start
	// summarizeOver is the package's summarizeOver; tests may change it
	// before start.
	summarizeOver int

	mu       sync.Mutex
	timeline []TimelineEntry // ring of timelineSize, oldest first once full
	seq      uint64
	sentSeq  uint64              // the last change pushed to the streams
	dirty    map[string]struct{} // services changed since the last update
	streams  map[*stream]struct{}
	fprints  map[string]uint64 // services' request counters as last sent
	cursor   string            // the last service a stats check sent: the next starts after it
	shutdown bool
	// nstreams mirrors len(streams) for the request path, which reads it
	// without the lock.
	nstreams atomic.Int32

	wake     chan struct{}
	done     chan struct{}
	loopDone chan struct{}
}

func newDashboard(g *Gateway) *dashboard {
	return &dashboard{
		g: g, maxStreams: maxStreams, heartbeat: heartbeatInterval, statsEvery: statsInterval, statsMax: maxStatsServers,
		summarizeOver: summarizeOver,
		dirty:         map[string]struct{}{}, streams: map[*stream]struct{}{},
		fprints: map[string]uint64{},
		wake:    make(chan struct{}, 1), done: make(chan struct{}),
	}
}

func (d *dashboard) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// observer wraps the proxy's observer: an attempt that fails marks its
// service, so that the failures it counts and a breaker it trips show at
// the next update (within updateInterval) rather than at the next stats
// check. Without a stream open it costs an atomic load.
func (d *dashboard) observer(next lbhttp.Observer) lbhttp.Observer {
	onResult := next.OnResult
	next.OnResult = func(r lbhttp.Result) {
		if onResult != nil {
			onResult(r)
		}
		if r.Err == nil || d.nstreams.Load() == 0 {
			return
		}
		d.mu.Lock()
		d.dirty[r.Service] = struct{}{}
		d.mu.Unlock()
		d.poke()
	}
	return next
}

// start runs the update loop until stop.
func (d *dashboard) start() {
	d.loopDone = make(chan struct{})
	go d.run()
}

// stop ends the loop and every stream; the streams' handlers return.
func (d *dashboard) stop() {
	d.mu.Lock()
	if d.shutdown {
		d.mu.Unlock()
		return
	}
	d.shutdown = true
	d.mu.Unlock()
	close(d.done)
	if d.loopDone != nil {
		<-d.loopDone
	}
}

func (d *dashboard) run() {
	defer close(d.loopDone)
	stats := time.NewTicker(d.statsEvery)
	defer stats.Stop()
	var last time.Time
	for {
		select {
		case <-d.done:
			return
		case <-stats.C:
			d.markBusyServices()
		case <-d.wake:
		}
		// At most one update per updateInterval: changes that arrive in
		// between are sent together.
		if wait := updateInterval - time.Since(last); wait > 0 {
			select {
			case <-d.done:
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		d.flush()
	}
}

// update is what a stream's "update" event carries: the services that
// changed (whole in services, or in summaries when the gateway holds more
// than summarizeOver instances), those that went, the new timeline entries
// and the gateway's counters.
type update struct {
	Services  []ServiceState   `json:"services"`
	Summaries []ServiceSummary `json:"summaries,omitempty"`
	Removed   []string         `json:"removed,omitempty"`
	Changes   []TimelineEntry  `json:"changes,omitempty"`
	Header    State            `json:"header"`
}

// flush pushes one update.
func (d *dashboard) flush() {
	d.mu.Lock()
	dirty := d.dirty
	d.dirty = map[string]struct{}{}
	var changes []TimelineEntry
	for _, c := range d.timeline {
		if c.Seq > d.sentSeq {
			changes = append(changes, c)
		}
	}
	d.sentSeq = d.seq
	streams := len(d.streams)
	d.mu.Unlock()
	if streams == 0 {
		return
	}
	u := update{Services: []ServiceState{}, Changes: changes, Header: d.g.header()}
	summarize := d.summarizing()
	for name := range dirty {
		if summarize {
			if sum, ok := d.g.serviceSummary(name); ok {
				u.Summaries = append(u.Summaries, sum)
				continue
			}
		} else if ss, ok := d.g.serviceState(name); ok {
			u.Services = append(u.Services, ss)
			continue
		}
		u.Removed = append(u.Removed, name)
	}
	if len(u.Services) == 0 && len(u.Summaries) == 0 && len(u.Removed) == 0 && len(u.Changes) == 0 {
		return
	}
	d.broadcast(sseMessage("update", u))
}

// markBusyServices marks the services whose request counters moved since
// they were last sent, so that the page follows active requests, response
// times and breakers, not only list changes: up to statsMax servers' worth
// per check, the others at the next checks.
func (d *dashboard) markBusyServices() {
	if d.nstreams.Load() == 0 || d.g.client == nil {
		return
	}
	type counters struct {
		fp      uint64
		servers int
	}
	now := map[string]counters{}
	total := 0
	for _, name := range d.g.client.Services() {
		b, err := d.g.client.Balancer(name)
		if err != nil {
			continue
		}
		var fp uint64
		all := b.Servers()
		for _, s := range all {
			st := s.PeekStats()
			fp = fp*31 + uint64(st.Requests())*7 + uint64(st.ActiveRequests())*13 + uint64(st.SuccessiveFailures())
			if st.CircuitTripped() {
				fp++
			}
		}
		now[name] = counters{fp, len(all)}
		total += len(all)
	}
	// A summary costs about one server's worth, whatever the instances.
	summarize := total > d.summarizeOver
	d.mu.Lock()
	defer d.mu.Unlock()
	for name := range d.fprints {
		if _, ok := now[name]; !ok {
			delete(d.fprints, name)
		}
	}
	var moved []string
	for name, c := range now {
		if d.fprints[name] == c.fp {
			continue
		}
		if _, ok := d.dirty[name]; ok { // sent anyway
			d.fprints[name] = c.fp
			continue
		}
		moved = append(moved, name)
	}
	slices.Sort(moved)
	// Take turns: start after the service the last check stopped at.
	first, _ := slices.BinarySearch(moved, d.cursor+"\x00")
	budget := d.statsMax
	for i := range moved {
		if budget <= 0 {
			break
		}
		name := moved[(first+i)%len(moved)]
		d.fprints[name] = now[name].fp
		d.dirty[name] = struct{}{}
		d.cursor = name
		if summarize {
			budget--
		} else {
			budget -= max(now[name].servers, 1)
		}
	}
}
