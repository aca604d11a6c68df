package balancer

import (
	"sync/atomic"
	"time"
)

// Outlier ejection (Config.OutlierDetection) and the panic threshold
// (Config.PanicThreshold).
//
// An ejection is a time, as a breaker's blackout is: a server is ejected
// while the clock is before its ejectedUntil. Nothing runs when it ends;
// the picks and the zone decision read it, and the zone decision is made
// again when an ejection starts and when it is due (as for a blackout).
//
// Every rule leaves ejected servers out: the rules that skip tripped
// servers (ZoneAvoidance, AvailabilityFiltering, BestAvailable,
// LeastRequest) see them through PickInfo.Tripped; a rule that ignores the
// breaker, as Ribbon's RoundRobin, Random and WeightedResponseTime do, has
// a choice of an ejected server replaced by the next server round robin
// that is not ejected (Balancer.skipEjected). When every server is
// ejected, or in panic, the rule's choice stands: an ejection never leaves
// a service without a server.

// outlierCounters are one server's outlier-detection counters: server
// errors in a row, the end of the current or last ejection (nanotime, 0:
// never ejected), and the ejections in a row, the multiplier of the next
// one's length. A server has them from its first server error under
// outlier detection on (ServerStats.outlier); until then every counter
// reads as 0.
type outlierCounters struct {
	serverErrors atomic.Int64
	ejectedUntil atomic.Int64
	ejections    atomic.Int64
}

// outlierCounters returns the server's outlier counters, allocating them
// on first use; concurrent first uses agree on one.
func (s *ServerStats) outlierCounters() *outlierCounters { return lazy(&s.outlier) }

// serverError counts an answer that was a server error, and ejects the
// server at Consecutive5xx in a row if the service's ejection limit
// allows it.
func (s *ServerStats) serverError() {
	o := &s.shared.outlier
	if o.Consecutive5xx == 0 {
		return
	}
	c := s.outlierCounters()
	if c.serverErrors.Add(1) < int64(o.Consecutive5xx) {
		return
	}
	now := s.shared.coarseNanotime()
	prev := c.ejectedUntil.Load()
	if now < prev {
		return // ejected already: answers that were under way
	}
	if f := s.shared.ejectionAllowed; f != nil && !f(now) {
		return // the limit; the count stays, so the next error tries again
	}
	k := c.ejections.Add(1)
	if prev != 0 && now-prev > int64(o.MaxEjectionTime) {
		// Healthy for a whole maximum ejection since the last one: start
		// from the base again.
		c.ejections.Store(1)
		k = 1
	}
	until := now + int64(min(time.Duration(k)*o.BaseEjectionTime, o.MaxEjectionTime))
	if !c.ejectedUntil.CompareAndSwap(prev, until) {
		return // another error's goroutine ejected it
	}
	c.serverErrors.Store(0)
	for {
		m := s.shared.ejectedUntilMax.Load()
		if until <= m || s.shared.ejectedUntilMax.CompareAndSwap(m, until) {
			break
		}
	}
	s.shared.ejectionsTotal.Add(1)
	s.changed()
	s.shared.breakerChanged() // the zone decision counts it
}

// goodAnswer resets the count of server errors in a row; no write when
// it is 0 (or the server never had a server error counted).
func (s *ServerStats) goodAnswer() {
	if c := s.outlier.Load(); c != nil && c.serverErrors.Load() != 0 {
		c.serverErrors.Store(0)
	}
}

// ejectedUntil is the end of the server's current or last ejection
// (nanotime), 0 when it was never ejected.
func (s *ServerStats) ejectedUntil() int64 {
	if c := s.outlier.Load(); c != nil {
		return c.ejectedUntil.Load()
	}
	return 0
}

// ejectedAt reports whether the server is ejected at now.
func (s *ServerStats) ejectedAt(now int64) bool { return now < s.ejectedUntil() }

// Ejected reports whether outlier detection has ejected the server now.
func (s *ServerStats) Ejected() bool { return s.ejectedAt(s.shared.nanotime()) }

// EjectionRemaining returns how long the server stays ejected, 0 when it
// is not.
func (s *ServerStats) EjectionRemaining() time.Duration {
	return time.Duration(max(s.ejectedUntil()-s.shared.nanotime(), 0))
}

// SuccessiveServerErrors returns the count of server errors in a row.
func (s *ServerStats) SuccessiveServerErrors() int64 {
	if c := s.outlier.Load(); c != nil {
		return c.serverErrors.Load()
	}
	return 0
}

// mayBeEjected reports whether some server of the balancer may be ejected
// at now: an ejection ended at the latest at ejectedUntilMax.
func (sh *statsShared) mayBeEjected(now int64) bool { return now < sh.ejectedUntilMax.Load() }

// quiet reports that no server of the balancer can be tripped or ejected,
// so that a pick need read none: none has reached its breaker's threshold
// and none was ever ejected. A failure that reaches a threshold counts in
// atThreshold, and an ejection raises ejectedUntilMax, before it returns: a
// pick that starts after either returned sees it. Picks test it first (it
// inlines), then noneUnavailableNow.
func (sh *statsShared) quiet() bool {
	return sh.atThreshold.Load()|sh.ejectedUntilMax.Load() == 0 && sh.breaker.Threshold > 0
}

// noneUnavailableNow reports, when quiet does not, that no server is
// tripped or ejected at the pick p all the same: none at its threshold and
// every ejection over, or the balancer in panic, which ignores both.
func (sh *statsShared) noneUnavailableNow(p *PickInfo) bool {
	return sh.breaker.Threshold > 0 && sh.atThreshold.Load() == 0 && !sh.mayBeEjected(p.nanotime()) ||
		sh.panicking.Load()
}

// ejectionAllowed reports whether one more server may be ejected at now:
// when none is, or when the ejected ones, one more included, stay within
// MaxEjectionPercent of the alive servers. O(servers), once an ejection.
func (b *Balancer) ejectionAllowed(now int64) bool {
	alive := b.snap.Load().full.servers
	ejected := 0
	for _, s := range alive {
		if s.inst.view().ejectedAt(now) {
			ejected++
		}
	}
	return ejected == 0 || float64(ejected+1)*100 <= b.cfg.OutlierDetection.MaxEjectionPercent*float64(len(alive))
}

// skipEjected replaces srv, a rule's choice, when it is ejected: by the
// next server round robin of v, then c, then every alive server, that is
// not ejected. srv stands in panic, or when every server is ejected.
func (b *Balancer) skipEjected(srv *Server, snap *Snapshot, v, c *View, now int64, hasNow bool) (*Server, int64) {
	if !hasNow {
		now = b.shared.coarseNanotime()
	}
	if srv.inst == nil || !srv.inst.view().ejectedAt(now) || b.shared.panicking.Load() {
		return srv, now
	}
	pi := PickInfo{b: b, now: now, hasNow: true}
	for _, view := range [...]*View{v, c, &snap.full} {
		if s := b.ejectRR.roundRobinAvailable(view, availability{ejectedOnly: true}, &pi); s != nil {
			return s, now
		}
	}
	return srv, now
}

// PanicListener is told when a balancer enters panic (Config.PanicThreshold:
// too few healthy servers, so picks balance over all of them) and when it
// leaves it, with the healthy and alive server counts of that moment. It
// is called from the goroutine that changed the state (a list change, a
// breaker's trip or reset, an ejection, a pick that found the decision
// due), possibly with the balancer's list lock held: it must return
// quickly and must not change the balancer's list. Logging and counting
// are what it is for.
type PanicListener func(b *Balancer, panic bool, healthy, alive int)

// WithPanicListener sets the balancer's PanicListener.
func WithPanicListener(l PanicListener) Option {
	return func(b *Balancer) error {
		b.onPanic = l
		return nil
	}
}

// Panicking reports whether the balancer is in panic now: fewer than
// Config.PanicThreshold percent of its alive servers are healthy, and
// picks ignore breakers and ejections.
func (b *Balancer) Panicking() bool { return b.shared.panicking.Load() }

// Ejections returns how many times outlier detection ejected a server.
func (b *Balancer) Ejections() uint64 { return b.shared.ejectionsTotal.Load() }

// notePanic records the panic state of a new zone decision and tells the
// listener when it changed.
func (b *Balancer) notePanic(d *zoneDecision) {
	if b.shared.panicking.Swap(d.panic) != d.panic && b.onPanic != nil {
		b.onPanic(b, d.panic, d.healthy, d.alive)
	}
}

// panicOf reports whether the zone statistics put the balancer in panic,
// and the healthy and alive counts.
func (b *Balancer) panicOf(stats []ZoneSnapshot) (panic bool, healthy, alive int) {
	for _, st := range stats {
		alive += st.InstanceCount
		healthy += st.InstanceCount - st.TrippedCount
	}
	t := b.cfg.PanicThreshold
	return t > 0 && alive > 0 && float64(healthy)*100 < t*float64(alive), healthy, alive
}
