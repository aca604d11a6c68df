package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/lbhttp"
)

// Dashboard limits and pacing.
const (
	// timelineSize is how many list changes /-/lb keeps.
	timelineSize = 100
	// maxStreams bounds the /-/lb/events streams served at once.
	maxStreams = 64
	// streamBuffer is the number of updates a stream may fall behind
	// before it is dropped: a slow client never blocks the gateway.
	streamBuffer = 32
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
	// heartbeatInterval is how often an idle stream gets a comment, so
	// that proxies and the browser see it alive.
	heartbeatInterval = 15 * time.Second
	// summarizeOver is the number of instances on the gateway (every
	// service's together) above which the streams carry per-service
	// summaries (ServiceSummary) instead of every instance: the page
	// fetches an opened service's instances from /-/lb/service. 5,000
	// instances make a first state of about 1.9 MB in full; 100,000 would
	// make 37 MB.
	summarizeOver = 5000
)

// The sources of a list change, as the timeline names them.
const (
	SourceEvent    = "event"    // an online or offline event on the bus
	SourceAdvisory = "advisory" // the NATS server's advisory that the instance's connection ended, confirmed by a probe (a crash)
	SourceGossip   = "gossip"   // gossip declared the instance dead, gone or back
	SourceRegistry = "registry" // the registry mirror: a new record, a deletion or an expired lease
	SourceResync   = "resync"   // a full resynchronisation of the mirror (start, reconnect)
	SourceConfig   = "config"   // a static listOfServers in the balancer configuration
)

// ListChange is one entry of the timeline: an instance that joined or left
// a service's list.
type ListChange struct {
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
	timeline []ListChange // ring of timelineSize, oldest first once full
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
	c := ListChange{Seq: d.seq, At: lc.At, Service: lc.Service, Instance: sc.Server.ID, Addr: sc.Server.Addr(),
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

// Timeline returns the recent list changes, oldest first.
func (d *dashboard) Timeline() []ListChange {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append(make([]ListChange, 0, len(d.timeline)), d.timeline...) // [] in JSON when empty, not null
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
	Changes   []ListChange     `json:"changes,omitempty"`
	Header    State            `json:"header"`
}

// flush pushes one update.
func (d *dashboard) flush() {
	d.mu.Lock()
	dirty := d.dirty
	d.dirty = map[string]struct{}{}
	var changes []ListChange
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
			st := s.Stats()
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

// stream is one /-/lb/events client.
type stream struct {
	ch      chan []byte
	dropped chan struct{}
	once    sync.Once
}

func (s *stream) drop() { s.once.Do(func() { close(s.dropped) }) }

// subscribe adds a stream, or returns nil at the limit or after stop.
func (d *dashboard) subscribe() *stream {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shutdown || len(d.streams) >= d.maxStreams {
		return nil
	}
	s := &stream{ch: make(chan []byte, streamBuffer), dropped: make(chan struct{})}
	d.streams[s] = struct{}{}
	d.nstreams.Store(int32(len(d.streams)))
	return s
}

func (d *dashboard) unsubscribe(s *stream) {
	d.mu.Lock()
	delete(d.streams, s)
	d.nstreams.Store(int32(len(d.streams)))
	d.mu.Unlock()
}

// broadcast queues msg on every stream; a stream whose buffer is full is
// dropped (its handler returns, the browser reconnects and gets the whole
// state again).
func (d *dashboard) broadcast(msg []byte) {
	d.mu.Lock()
	streams := make([]*stream, 0, len(d.streams))
	for s := range d.streams {
		streams = append(streams, s)
	}
	d.mu.Unlock()
	for _, s := range streams {
		select {
		case s.ch <- msg:
		default:
			d.unsubscribe(s)
			s.drop()
		}
	}
}

// sseMessage encodes one server-sent event.
func sseMessage(event string, v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		data = []byte(fmt.Sprintf("%q", err.Error()))
	}
	var b bytes.Buffer
	b.Grow(len(data) + len(event) + 16)
	fmt.Fprintf(&b, "event: %s\ndata: ", event)
	b.Write(data)
	b.WriteString("\n\n")
	return b.Bytes()
}

// streamWriteTimeout bounds one write to a stream: a client that stopped
// reading is cut off rather than held.
const streamWriteTimeout = 10 * time.Second

// serveEvents is GET /-/lb/events: a text/event-stream that starts with
// the whole state ("state"; with summaries beyond summarizeOver instances),
// then pushes "update" events (changed
// services, new timeline entries) at most 4 times a second, and a comment
// every heartbeat.
func (d *dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	s := d.subscribe()
	if s == nil {
		http.Error(w, "too many /-/lb/events streams, or shutting down", http.StatusServiceUnavailable)
		return
	}
	defer d.unsubscribe(s)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	write := func(b []byte) bool {
		rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// Subscribed before the state is read, so no change falls in between.
	if !write(append([]byte("retry: 1000\n\n"), sseMessage("state", d.firstState())...)) {
		return
	}
	hb := time.NewTicker(d.heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-d.done:
			return
		case <-s.dropped:
			return
		case msg := <-s.ch:
			if !write(msg) {
				return
			}
		case <-hb.C:
			if !write([]byte(": heartbeat\n\n")) {
				return
			}
		}
	}
}

// ServiceSummary is what a stream carries of a service when the gateway
// holds more than summarizeOver instances: what its folded line on the
// page shows, without its instances (GET /-/lb/service?name= has them).
type ServiceSummary struct {
	Name string `json:"name"`
	Rule string `json:"rule"`
	// Instances counts the service's servers: Up those alive with a closed
	// breaker, Tripped those alive with an open one (the others are down).
	Instances  int                  `json:"instances"`
	Up         int                  `json:"up"`
	Tripped    int                  `json:"tripped"`
	Zones      map[string]ZoneState `json:"zones"`
	Updates    uint64               `json:"updates"`
	LastChange *time.Time           `json:"lastChange,omitempty"`
	Trips      uint64               `json:"breakerTrips"`
}

// streamState is the stream's first event: the State, its services in
// summaries when the gateway holds more than summarizeOver instances.
type streamState struct {
	State
	Summaries []ServiceSummary `json:"summaries,omitempty"`
}

// instances counts the servers of every service.
func (g *Gateway) instances() int {
	if g.client == nil {
		return 0
	}
	n := 0
	for _, name := range g.client.Services() {
		if sv, ok := g.client.ServiceStats(name); ok {
			n += sv.Servers
		}
	}
	return n
}

// summarizing reports whether the streams carry summaries: the gateway
// holds more than summarizeOver instances.
func (d *dashboard) summarizing() bool { return d.g.instances() > d.summarizeOver }

// firstState is a stream's first event: the whole State, or the services'
// summaries beyond summarizeOver instances.
func (d *dashboard) firstState() streamState {
	if !d.summarizing() {
		return streamState{State: d.g.State()}
	}
	st := streamState{State: d.g.header(), Summaries: []ServiceSummary{}}
	st.Services = []ServiceState{}
	st.Timeline = d.Timeline()
	for _, name := range d.g.client.Services() {
		if sum, ok := d.g.serviceSummary(name); ok {
			st.Summaries = append(st.Summaries, sum)
		}
	}
	return st
}

// serviceSummary reads one service's summary; false when it has none.
func (g *Gateway) serviceSummary(name string) (ServiceSummary, bool) {
	if g.client == nil {
		return ServiceSummary{}, false
	}
	sv, ok := g.client.ServiceStats(name)
	if !ok {
		return ServiceSummary{}, false
	}
	b, err := g.client.Balancer(name)
	if err != nil {
		return ServiceSummary{}, false
	}
	cfg := b.Config()
	sum := ServiceSummary{Name: name, Rule: cfg.Rule, Zones: map[string]ZoneState{}, Updates: sv.Updates, Trips: sv.BreakerTrips}
	if !sv.LastChange.IsZero() {
		sum.LastChange = &sv.LastChange
	}
	zones := b.ZoneSnapshots()
	for z, zs := range zones {
		sum.Zones[z] = ZoneState{Instances: zs.InstanceCount, Tripped: zs.TrippedCount, ActiveRequests: zs.ActiveRequests, LoadPerServer: zs.LoadPerServer}
	}
	if (cfg.ZoneAware || cfg.Rule == balancer.RuleZoneAvoidance) && len(zones) > 1 {
		markAvoided(sum.Zones, cfg.ZoneAvoidance)
	}
	for _, s := range b.Servers() {
		sum.Instances++
		switch {
		case !s.Alive():
		case s.Stats().CircuitTripped():
			sum.Tripped++
		default:
			sum.Up++
		}
	}
	return sum, true
}

// serveService is GET /-/lb/service?name=: one service as /-/lb shows it,
// with every instance; the page fetches it when a service is opened while
// the stream carries summaries.
func (g *Gateway) serveService(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if name == "" {
		http.Error(w, "usage: GET /-/lb/service?name=SERVICE", http.StatusBadRequest)
		return
	}
	ss, ok := g.serviceState(name)
	if !ok {
		http.Error(w, "no such service", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	json.NewEncoder(w).Encode(ss)
}
