package balancer

import (
	"math"
	"sync/atomic"
	"time"
)

// Clock tells the time. Tests inject a fake one; the default is time.Now.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// BreakerConfig is the circuit breaker of Ribbon's ServerStats. A server with
// f successive connection failures, f >= Threshold, is tripped for
// min(2^(f-Threshold) x Factor, Max) after its last failure; a response
// resets f.
type BreakerConfig struct {
	// Threshold is the number of successive connection failures that trips
	// the breaker (Ribbon's connectionFailureCountThreshold). Default 3.
	Threshold int `yaml:"threshold"`
	// Factor is the first blackout (circuitTripTimeoutFactorSeconds).
	// Default 10s.
	Factor time.Duration `yaml:"factor"`
	// Max caps the blackout (circuitTripMaxTimeoutSeconds). Default 30s.
	Max time.Duration `yaml:"max"`
}

// Blackout returns how long a server with failures successive connection
// failures stays tripped after its last one: 0 below the threshold.
func (c BreakerConfig) Blackout(failures int64) time.Duration {
	diff := failures - int64(c.Threshold)
	if diff < 0 {
		return 0
	}
	diff = min(diff, 16) // Ribbon's cap on the exponent; also keeps the shift safe
	return min(time.Duration(1<<diff)*c.Factor, c.Max)
}

// statsShared is what every ServerStats of one balancer refers to.
type statsShared struct {
	clock         Clock
	base          time.Time
	breaker       BreakerConfig
	activeTimeout time.Duration // active-request count decays to 0 when untouched this long
	// timed: a pick reads the system clock to time its request, for a
	// Done without a ResponseTime (see WithoutPickTiming).
	timed bool
	// coarse: the balancer is started on the system clock, so its
	// statistics read the coarse clock (coarseclock.go).
	coarse atomic.Bool
	// Outlier detection and panic (outlier.go): the config (Consecutive5xx
	// 0: off), the latest end of any ejection (no server is ejected at or
	// after it), ejections counted, the balancer's ejection limit, and
	// whether the last zone decision is in panic.
	outlier         OutlierConfig
	ejectedUntilMax atomic.Int64
	ejectionsTotal  atomic.Uint64
	ejectionAllowed func(now int64) bool
	panicking       atomic.Bool
	// epoch grows whenever a breaker trips or resets, so that a zone
	// decision made while one changed knows it must be made again.
	epoch atomic.Uint64
	// trips counts breakers tripping: a closed breaker opening, whether at
	// the threshold or, after a blackout ended, at a later failure.
	trips atomic.Uint64
	// atThreshold counts the servers whose successive connection failures
	// reached the breaker's threshold since their last reset: counted when
	// the count reaches it, uncounted when a response resets it. A server
	// removed meanwhile stays counted, so it is an upper bound; 0 means no
	// breaker can be open, which lets a pick skip reading each server's
	// statistics (PickInfo.Tripped).
	atThreshold atomic.Int64

	// The zone decision (zone.go) is the balancer's; the statistics tell
	// it when its inputs change. zonesChanged remakes it at once (a
	// breaker tripped or reset); zonesDueAt remakes it if it is due.
	// zonesDue is the nanotime it is due (math.MaxInt64: load does not
	// matter to it); zonesPending reports an active count changed since it
	// was made, so that a Choose, which reads no clock otherwise, reads it
	// to see whether the decision is due.
	zonesChanged func()
	zonesDueAt   func(now int64)
	// zonesLoadChanged marks the current decision once zonesPending is
	// set (Balancer.markLoadChanged), for choose's common case, which
	// tests the decision alone.
	zonesLoadChanged func()
	zonesDue         atomic.Int64
	zonesPending     atomic.Bool

	// none is the statistics of every server that has had no request yet
	// (instance.view): all zero, read and never written.
	none ServerStats
}

// loadChanged tells the zone decision that an active count changed at now:
// it is remade if due, otherwise marked pending. One atomic load when load
// does not matter to it.
func (s *statsShared) loadChanged(now int64) {
	due := s.zonesDue.Load()
	switch {
	case due == math.MaxInt64:
	case now >= due:
		if s.zonesDueAt != nil {
			s.zonesDueAt(now)
		}
	case !s.zonesPending.Load():
		s.zonesPending.Store(true)
		if s.zonesLoadChanged != nil {
			s.zonesLoadChanged()
		}
	}
}

// breakerChanged counts a breaker's trip or reset and remakes the zone
// decision at once.
func (s *statsShared) breakerChanged() {
	s.epoch.Add(1)
	if s.zonesChanged != nil {
		s.zonesChanged()
	}
}

// nanotime is monotonic nanoseconds since the clock's base: the process's
// start (processBase) for the system clock, the balancer's construction
// for a clock of its own.
func (s *statsShared) nanotime() int64 {
	if _, system := s.clock.(systemClock); system {
		// time.Since reads only the monotonic clock: half the cost of
		// time.Now, which also reads the wall clock.
		return sinceProcessBase()
	}
	return int64(s.clock.Now().Sub(s.base))
}

// coarseNanotime is nanotime to about a millisecond, for the statistics
// that need no better: the coarse clock's while the balancer is started
// on the system clock, nanotime otherwise.
func (s *statsShared) coarseNanotime() int64 {
	if s.coarse.Load() {
		return coarse.nanotime()
	}
	return s.nanotime()
}

// pickTime is the time a request starts at: nanotime when picks time
// their requests, coarseNanotime otherwise.
func (s *statsShared) pickTime() int64 {
	if s.timed {
		return s.nanotime()
	}
	return s.coarseNanotime()
}

// ServerStats are the live statistics of one instance in one balancer. They
// survive list changes for as long as the instance stays listed. They are
// read here (for admin pages and metrics) and written through the Pick of
// each request. All methods are safe for concurrent use. A ServerStats
// must not be copied.
type ServerStats struct {
	_      noCopy
	shared *statsShared

	active        atomic.Int64
	activeChanged atomic.Int64 // nanotime of the last change of active
	rtBits        atomic.Uint64
	responses     atomic.Int64
	requests      atomic.Int64

	// breaker holds the circuit breaker's counters, allocated on the
	// server's first connection failure: nil for almost every server, 16
	// bytes less per server (an 80-byte instance instead of 96).
	breaker atomic.Pointer[breakerCounters]

	// outlier holds the outlier-detection counters (outlier.go), allocated
	// on the server's first server error while outlier detection is on:
	// nil for almost every server, 16 bytes less per server than the
	// counters themselves.
	outlier atomic.Pointer[outlierCounters]

	// watch is set under BestAvailable only: the leaves of its index to
	// update when the active count or the breaker changes (see changed).
	watch atomic.Pointer[activeWatch]
}

// breakerCounters are one server's circuit-breaker counters: connection
// failures in a row, the last one's time (nanotime), and the end of the
// blackout as the failures set it (0 after a reset), which tells a failure
// that opens the breaker from one that extends it. A server has them from
// its first connection failure (ServerStats.breaker); until then every
// counter reads as 0.
type breakerCounters struct {
	failures    atomic.Int64
	lastFailure atomic.Int64
	openUntil   atomic.Int64
}

// lazy returns *p, allocating it on first use; concurrent first uses
// agree on one.
func lazy[T any](p *atomic.Pointer[T]) *T {
	if c := p.Load(); c != nil {
		return c
	}
	c := new(T)
	if p.CompareAndSwap(nil, c) {
		return c
	}
	return p.Load()
}

// failureCount returns the connection failures in a row.
func (s *ServerStats) failureCount() int64 {
	if c := s.breaker.Load(); c != nil {
		return c.failures.Load()
	}
	return 0
}

// noCopy makes go vet's copylocks check flag copies.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// responseTimeWeight is the weight of a new sample in the response-time
// average (an exponentially weighted moving average), so the average follows
// a server that becomes slow instead of remembering its whole life.
const responseTimeWeight = 0.1

// The mutators below are unexported: callers record a request through a
// Pick (Balancer.Pick or Begin), which calls them in the right order.

// requestStarted records the start of a request to the server and returns
// the time it read.
func (s *ServerStats) requestStarted() int64 { return s.requestStartedAt(s.shared.pickTime()) }

// requestStartedAt is requestStarted at now, a time the caller read.
func (s *ServerStats) requestStartedAt(now int64) int64 {
	// A count that had decayed restarts from zero.
	changedAt := s.activeChanged.Load()
	if now-changedAt > int64(s.shared.activeTimeout) {
		s.active.Store(0)
	}
	s.active.Add(1)
	s.noteActiveChanged(changedAt, now)
	s.requests.Add(1)
	s.changed()
	s.shared.loadChanged(now)
	return now
}

// noteActiveChanged records that active changed at now, found at
// changedAt. It writes only a new time: an atomic store is a locked
// instruction on amd64, as dear as an addition, and with the coarse clock
// most requests of a millisecond find the same time there.
func (s *ServerStats) noteActiveChanged(changedAt, now int64) {
	if changedAt != now {
		s.activeChanged.Store(now)
	}
}

// responseReceived records a response that arrived after responseTime
// (its headers) and resets the successive-failure count, but leaves the
// request active until endRequest.
func (s *ServerStats) responseReceived(responseTime time.Duration) {
	s.noteResponseTime(responseTime)
	s.answered()
}

// answered resets the successive-failure count, closing the breaker. It
// writes nothing when the count is already 0, as it is on almost every
// answer: no write to share between cores.
func (s *ServerStats) answered() {
	c := s.breaker.Load()
	if c == nil {
		return
	}
	if c.failures.Load() != 0 && c.failures.Swap(0) >= int64(s.shared.breaker.Threshold) {
		s.shared.atThreshold.Add(-1)
		c.openUntil.Store(0)
		s.changed()
		s.shared.breakerChanged()
	}
}

// requestFailed records a request that got no response. A connection
// failure (nothing reached the server: refused, unreachable, connect timeout)
// counts towards the circuit breaker; other failures only end the request.
func (s *ServerStats) requestFailed(connectionFailure bool) {
	s.endRequest()
	if connectionFailure {
		s.noteConnectionFailure()
	}
}

// noteConnectionFailure counts one successive connection failure without
// touching the active-request count.
//
// A failure that opens a closed breaker is a trip: the first failure at the
// threshold, and also a later one once the blackout it extended has ended
// (failures above the threshold). Failures while the breaker is open only
// extend the blackout.
func (s *ServerStats) noteConnectionFailure() {
	now := s.shared.nanotime()
	c := lazy(&s.breaker)
	c.lastFailure.Store(now)
	f := c.failures.Add(1)
	if f == int64(s.shared.breaker.Threshold) {
		s.shared.atThreshold.Add(1)
	}
	tripped := false
	if blackout := s.shared.breaker.Blackout(f); blackout > 0 { // f at or above the threshold
		// openUntil decides which failure opened the breaker, exactly,
		// however many arrive together.
		until := now + int64(blackout)
		for {
			old := c.openUntil.Load()
			if until <= old {
				break // open at least that long already
			}
			if c.openUntil.CompareAndSwap(old, until) {
				tripped = now >= old
				break
			}
		}
	}
	s.changed()
	if tripped {
		s.shared.trips.Add(1)
		s.shared.breakerChanged()
	}
}

// endRequest ends a request started with requestStarted.
func (s *ServerStats) endRequest() { s.endRequestAt(s.shared.coarseNanotime()) }

// endRequestAt is endRequest at now, a time the caller read.
func (s *ServerStats) endRequestAt(now int64) {
	for {
		n := s.active.Load()
		if n <= 0 {
			return
		}
		if s.active.CompareAndSwap(n, n-1) {
			s.noteActiveChanged(s.activeChanged.Load(), now)
			s.changed()
			s.shared.loadChanged(now)
			return
		}
	}
}

func (s *ServerStats) noteResponseTime(d time.Duration) {
	x := float64(d)
	if s.responses.Add(1) == 1 {
		s.rtBits.Store(math.Float64bits(x))
		return
	}
	for {
		old := s.rtBits.Load()
		avg := math.Float64frombits(old)
		next := avg + responseTimeWeight*(x-avg)
		if s.rtBits.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// ActiveRequests returns the number of requests in flight. A count that has
// not changed for the active-request timeout (600 s by default) reads as 0,
// so a leaked count cannot pin a server forever.
func (s *ServerStats) ActiveRequests() int64 { return s.activeAt(s.shared.nanotime()) }

func (s *ServerStats) activeAt(now int64) int64 {
	if now-s.activeChanged.Load() > int64(s.shared.activeTimeout) {
		return 0
	}
	return max(s.active.Load(), 0)
}

// ResponseTime returns the average response time (exponentially weighted),
// and false when no response has been recorded yet.
func (s *ServerStats) ResponseTime() (time.Duration, bool) {
	if s.responses.Load() == 0 {
		return 0, false
	}
	return time.Duration(math.Float64frombits(s.rtBits.Load())), true
}

// SuccessiveFailures returns the count of successive connection failures.
func (s *ServerStats) SuccessiveFailures() int64 { return s.failureCount() }

// Requests returns the number of requests started.
func (s *ServerStats) Requests() int64 { return s.requests.Load() }

// CircuitTripped reports whether the circuit breaker is open now.
func (s *ServerStats) CircuitTripped() bool { return s.trippedAt(s.shared.nanotime()) }

// BlackoutRemaining returns how long the breaker stays open, 0 when closed.
func (s *ServerStats) BlackoutRemaining() time.Duration {
	end := s.blackoutEnd()
	if end == 0 {
		return 0
	}
	return time.Duration(max(end-s.shared.nanotime(), 0))
}

func (s *ServerStats) trippedAt(now int64) bool { return now < s.blackoutEnd() }

// blackoutEnd returns when the breaker's blackout ends (nanotime), or 0
// while the failures in a row are below the threshold: the breaker is
// open before that time.
func (s *ServerStats) blackoutEnd() int64 {
	c := s.breaker.Load()
	if c == nil {
		return 0
	}
	f := c.failures.Load()
	if f < int64(s.shared.breaker.Threshold) {
		return 0
	}
	return c.lastFailure.Load() + int64(s.shared.breaker.Blackout(f))
}

// ZoneSnapshot summarises the servers of one zone, as Ribbon's ZoneSnapshot.
type ZoneSnapshot struct {
	// InstanceCount is the number of usable (alive) servers in the zone.
	InstanceCount int `json:"instanceCount"`
	// TrippedCount is how many of them have their circuit breaker open or
	// are ejected by outlier detection.
	TrippedCount int `json:"trippedCount"`
	// ActiveRequests is the number of requests in flight to the zone.
	ActiveRequests int64 `json:"activeRequests"`
	// LoadPerServer is active requests on non-tripped servers divided by the
	// number of non-tripped servers; -1 when every server is tripped.
	LoadPerServer float64 `json:"loadPerServer"`
}

// zoneSnapshotOf computes a ZoneSnapshot over servers at time now.
//
// In panic (healthy, true) every server counts as healthy: none is
// counted tripped, and the load is over all of them.
func zoneSnapshotOf(servers []*Server, now int64, healthy bool) ZoneSnapshot {
	var z ZoneSnapshot
	var activeOnAvailable int64
	z.InstanceCount = len(servers)
	for _, s := range servers {
		st := s.inst.view()
		a := st.activeAt(now)
		if !healthy && (st.trippedAt(now) || st.ejectedAt(now)) {
			z.TrippedCount++
		} else {
			activeOnAvailable += a
		}
		z.ActiveRequests += a
	}
	switch {
	case z.InstanceCount == 0:
	case z.TrippedCount == z.InstanceCount:
		z.LoadPerServer = -1
	default:
		z.LoadPerServer = float64(activeOnAvailable) / float64(z.InstanceCount-z.TrippedCount)
	}
	return z
}
