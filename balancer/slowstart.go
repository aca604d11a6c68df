package balancer

import (
	"math"
	"sync/atomic"
	"time"
)

// Slow start (Envoy's slow_start_config, Dubbo's warm-up): a server new
// to the list gets a share of traffic that grows over a window instead of
// its full share at once, so that a fresh process with cold caches, a
// cold JIT or an empty connection pool is not handed a full load.
//
// A server's weight is scaled, as Envoy's does, by
//
//	factor = max(MinWeightPercent / 100, timeFactor ^ (1 / Aggression))
//	timeFactor = max(time since its start, 1 s) / Window
//
// until Window has passed since its start; then it weighs its full weight.
// Its start is when it was listed: new to the list (never listed, or
// listed again after it left), or listed with another Server.Incarnation
// (the instance restarted). The servers of the balancer's first non-empty
// list do not ramp: they are the gateway's cold start, not new instances,
// and ramping all of them at once would change nothing but the cost.
// Marking a server down and up (a ping, a connection state) does not
// restart its ramp: it is the same life of the instance.
//
// The live weights are precomputed: while a server ramps, the snapshot
// carries them (Snapshot.ramp) and its weight tables are built from them,
// so picks stay what they are with weights (weights.go). They are
// recomputed every max(Window / 20, 1 s), and at the end of each server's
// window, off the request path: a goroutine of the balancer, the
// refresher, rebuilds the snapshot with the weights of the time. It runs
// only while a server ramps (a list change that starts a ramp starts it;
// it exits once a refresh finds no server ramping, and on Close), sleeps
// on a timer until the weights are due when the balancer is on the system
// clock, and is woken by the first pick that finds them due (the one
// wake-up of a balancer on an injected clock: tests). That pick does not
// wait for the refresh: it and the picks after it read the current
// snapshot until the new one is swapped in. When no server ramps the
// snapshot has no ramp, and a pick pays one nil check.

// SlowStartConfig is Config.SlowStart. Window 0 turns slow start off.
type SlowStartConfig struct {
	// Window is how long a new server's weight ramps up; 0 (default)
	// turns slow start off, otherwise at least 1s.
	Window time.Duration `yaml:"window"`
	// MinWeightPercent is the least share of its weight a ramping server
	// gets, 0 to 100. Default 10.
	MinWeightPercent float64 `yaml:"minWeightPercent"`
	// Aggression shapes the ramp: 1 (default) is linear in time, above 1
	// faster at first, below 1 slower at first. Must be positive.
	Aggression float64 `yaml:"aggression"`
}

// Slow-start defaults, Envoy's.
const (
	DefaultSlowStartMinWeightPercent = 10
	DefaultSlowStartAggression       = 1.0
)

// validate reports the first invalid setting, as Config.Validate does.
func (c SlowStartConfig) validate(bad func(field string, v any, why string) error) error {
	switch {
	case c.Window < 0 || (c.Window > 0 && c.Window < time.Second):
		return bad("slowStart.window", c.Window, "must be 0 (off) or at least 1s")
	case c.Window == 0:
		return nil
	case !(c.MinWeightPercent >= 0 && c.MinWeightPercent <= 100): // NaN too
		return bad("slowStart.minWeightPercent", c.MinWeightPercent, "must be within 0 and 100")
	case !(c.Aggression > 0) || math.IsInf(c.Aggression, 0):
		return bad("slowStart.aggression", c.Aggression, "must be a positive number (1 is linear)")
	}
	return nil
}

// Factor returns the share of its weight a server gets d after its start:
// Envoy's slow-start curve (see the package doc, "Slow start"); 1 once the
// window has passed, or when slow start is off.
func (c SlowStartConfig) Factor(d time.Duration) float64 {
	if c.Window <= 0 || d >= c.Window {
		return 1
	}
	tf := float64(max(d, time.Second)) / float64(c.Window)
	return min(max(c.MinWeightPercent/100, math.Pow(tf, 1/c.Aggression)), 1)
}

// refreshPeriod is how often the live weights are recomputed while a
// server ramps: Window / 20, at least a second.
func (c SlowStartConfig) refreshPeriod() time.Duration {
	return max(c.Window/20, time.Second)
}

// slowStart is a balancer's slow-start state; nil when slow start is off
// or its rule has no use for weights.
type slowStart struct {
	cfg SlowStartConfig
	b   *Balancer
	// kick wakes the refresher: a pick found the live weights due. It
	// holds one wake-up, so a pick never waits on it.
	kick chan struct{}
	// The fields below are guarded by the balancer's mu.
	//
	// started holds the servers within their window, by the nanotime
	// their window started; seeded: the balancer has had a server, so
	// the servers listed from now on ramp. refresher is the running
	// refresher, nil when none runs.
	started   map[*instance]int64
	seeded    bool
	refresher *rampRefresher
}

// rampRefresher is one run of a balancer's refresher: stop ends it, done
// is closed when it has.
type rampRefresher struct {
	stop, done chan struct{}
}

// newSlowStart returns the slow-start state of b with rule, or nil when
// there is none: off, or a keyed rule (Maglev, Rendezvous), which keeps
// keys on their servers and does not weigh them.
func newSlowStart(b *Balancer, cfg SlowStartConfig, rule Rule) *slowStart {
	if cfg.Window <= 0 || !weighs(rule) {
		return nil
	}
	return &slowStart{cfg: cfg, b: b, kick: make(chan struct{}, 1), started: make(map[*instance]int64)}
}

// weighs reports whether rule reads the live weights.
func weighs(rule Rule) bool {
	switch r := rule.(type) {
	case *Maglev, *Rendezvous:
		return false
	case *Retry:
		return weighs(r.Sub)
	}
	return true
}

// ramp is the slow start of one snapshot: the factors of the servers
// within their window, and when they are due to be recomputed. Immutable
// but for claimed.
type ramp struct {
	factor map[*instance]float64
	// scale: live weights are in units of 1/scale of a weight, so that a
	// ramping server's fraction of a weight is kept; chosen so that the
	// snapshot's total stays below 2^31 (weightTable, zone draws).
	scale int
	due   int64 // nanotime of the next refresh
	// claimed is set by the one pick that wakes the refresher for this
	// snapshot's ramp.
	claimed atomic.Bool
}

// rampScale is the finest unit of a live weight: 1/100 of a weight.
const rampScale = 100

// weight returns s's live weight: its weight, in units of 1/scale, scaled
// by its factor while it ramps; EffectiveWeight when r is nil.
func (r *ramp) weight(s *Server) int {
	if r == nil {
		return s.EffectiveWeight()
	}
	w := s.EffectiveWeight() * r.scale
	if f, ok := r.factor[s.inst]; ok {
		w = max(int(math.Round(float64(w)*f)), 1)
	}
	return w
}

// factorOf returns s's factor (1 when it does not ramp, or r is nil).
func (r *ramp) factorOf(s *Server) float64 {
	if r != nil {
		if f, ok := r.factor[s.inst]; ok {
			return f
		}
	}
	return 1
}

// noteList starts the window of the servers of list that are new to it
// since old, or listed with another incarnation, and the refresher if
// none runs; the first non-empty list seeds the balancer instead. Called
// with b.mu held, on an open balancer, before the snapshot of list is
// built.
func (s *slowStart) noteList(old, list []*Server, now int64) {
	if !s.seeded {
		s.seeded = len(list) > 0
		return
	}
	before := make(map[*instance]*Server, len(old))
	for _, srv := range old {
		before[srv.inst] = srv
	}
	for _, srv := range list {
		if prev, ok := before[srv.inst]; !ok || prev.Incarnation != srv.Incarnation {
			s.started[srv.inst] = now
		}
	}
	if len(s.started) > 0 && s.refresher == nil {
		r := &rampRefresher{stop: make(chan struct{}), done: make(chan struct{})}
		s.refresher = r
		go s.run(r)
	}
}

// rampAt returns the ramp of a snapshot of list as of now on clock, or
// nil when none of its servers is within its window; it forgets the
// servers whose window ended or that left the list. Called with b.mu held.
func (s *slowStart) rampAt(list []*Server, clock *statsShared) *ramp {
	if s == nil || len(s.started) == 0 {
		return nil
	}
	now := clock.nanotime()
	window := int64(s.cfg.Window)
	r := &ramp{factor: make(map[*instance]float64), due: now + int64(s.cfg.refreshPeriod())}
	started := make(map[*instance]int64, len(s.started))
	sum := 0
	for _, srv := range list {
		sum += srv.EffectiveWeight()
		at, ok := s.started[srv.inst]
		if !ok || now-at >= window {
			continue
		}
		started[srv.inst] = at
		r.factor[srv.inst] = s.cfg.Factor(time.Duration(now - at))
		r.due = min(r.due, at+window)
	}
	s.started = started
	if len(started) == 0 {
		return nil
	}
	r.scale = min(max((math.MaxInt32-1)/max(sum, 1), 1), rampScale)
	return r
}

// rampDue wakes the refresher when the pick at now (read here unless
// hasNow) is the first to find the live weights due, and returns the time.
// The pick does not wait for the refresh.
func (b *Balancer) rampDue(snap *Snapshot, now int64, hasNow bool) (int64, bool) {
	if !hasNow {
		now, hasNow = b.shared.coarseNanotime(), true
	}
	if now >= snap.ramp.due && snap.ramp.claimed.CompareAndSwap(false, true) {
		select {
		case b.slow.kick <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	return now, hasNow
}

// run is the refresher: it refreshes the live weights when they are due
// and waits until they are due again, on a timer when the balancer is on
// the system clock, and for a pick's wake-up in any case, until no server
// ramps or stop.
func (s *slowStart) run(r *rampRefresher) {
	defer close(r.done)
	var timer *time.Timer
	if _, system := s.b.shared.clock.(systemClock); system {
		timer = time.NewTimer(s.cfg.refreshPeriod())
		defer timer.Stop()
	}
	for {
		due, ramping := s.refresh(r)
		if !ramping {
			return
		}
		var wake <-chan time.Time
		if timer != nil {
			timer.Reset(time.Duration(due - s.b.shared.nanotime()))
			wake = timer.C
		}
		select {
		case <-r.stop:
			return
		case <-s.kick:
		case <-wake:
		}
	}
}

// refresh rebuilds the snapshot with the live weights of now if they are
// due (and the subsets over it), and returns when they are due next.
// When no server ramps any more, or the balancer is closed, it reports
// false and unregisters r, under the lock a list change that starts a
// ramp takes: that change then starts a new refresher.
func (s *slowStart) refresh(r *rampRefresher) (due int64, ramping bool) {
	b := s.b
	if snap := b.snap.Load(); snap.ramp != nil && b.shared.nanotime() >= snap.ramp.due {
		b.refreshRamps(snap)
		b.refreshSubsets()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	snap := b.snap.Load()
	if snap.ramp == nil || b.closed {
		if s.refresher == r {
			s.refresher = nil
		}
		return 0, false
	}
	return snap.ramp.due, true
}

// refreshRamps rebuilds snap with the live weights of now, unless a list
// change replaced it meanwhile (with the weights of its time) or the
// balancer is closed.
func (b *Balancer) refreshRamps(snap *Snapshot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.snap.Load() == snap && !b.closed {
		b.swapLocked(snap.all)
	}
}

// close stops the refresher, if one runs, and waits for it. Called by
// Balancer.Close once the balancer is closed, so that no list change
// starts another; nil-safe.
func (s *slowStart) close() {
	if s == nil {
		return
	}
	s.b.mu.Lock()
	r := s.refresher
	s.refresher = nil
	s.b.mu.Unlock()
	if r != nil {
		close(r.stop)
		<-r.done
	}
}

// Ramping returns the servers within their slow-start window, by the
// share of their weight they get now (Envoy's curve, as of the last
// refresh of the live weights): for admin pages and tests. Empty when
// slow start is off or no server ramps.
func (b *Balancer) Ramping() map[string]float64 {
	snap := b.snap.Load()
	out := make(map[string]float64)
	if snap.ramp == nil {
		return out
	}
	for _, s := range snap.all {
		if f, ok := snap.ramp.factor[s.inst]; ok {
			out[s.ID] = f
		}
	}
	return out
}
