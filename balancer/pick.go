package balancer

import (
	"context"
	"math/bits"
	"time"
)

// Choose picks a server for one request without recording anything: the
// server is not counted as busy and no outcome can be reported for it. Use
// it to look (an admin page, a test, a candidate to filter); to send a
// request, use Pick, or Begin on the server Choose returned. It is safe for
// concurrent use with everything else and, for the simple rules, takes no
// lock and allocates nothing. The context may force a zone (WithZone) or
// carry a key (WithKey). It returns ErrNoServers when there is nothing to
// choose, or the rule's error.
func (b *Balancer) Choose(ctx context.Context) (*Server, error) {
	srv, _, err := b.choose(ctx, 0, false)
	return srv, err
}

// choose is Choose at the pick's time now when hasNow (Pick reads it), and
// returns the time the pick used.
func (b *Balancer) choose(ctx context.Context, now int64, hasNow bool) (*Server, int64, error) {
	// Round robin's common case, first: the decision alone names the
	// servers (zoneDecision.rr: round robin, or ZoneAvoidance while every
	// server passes; no zone drawn, no ramp, equal weights), no context
	// may carry a subset or a zone, nothing was ejected or reached its
	// breaker's threshold under ZoneAvoidance, and the decision is not
	// due: a Pick compares its time with due; a Choose tests the
	// decision's recheck word, and reads the coarse clock (one load) only
	// when time alone changes the decision or the load changed since it
	// was made. Every load is at most two pointers from b, as grpc-go's
	// picker's: the counter's locked add waits for them all. Each test
	// leaves on its own: a chain of && and || was compiled into flags set
	// and tested again.
	d := b.decision.Load()
	if d.rr == nil {
		return b.chooseAny(ctx, now, hasNow)
	}
	if choicesCarried.Load() {
		return b.chooseAny(ctx, now, hasNow)
	}
	if b.sharedStats.ejectedUntilMax.Load() != 0 {
		return b.chooseAny(ctx, now, hasNow)
	}
	if d.rrQuiet && b.sharedStats.atThreshold.Load() != 0 {
		return b.chooseAny(ctx, now, hasNow)
	}
	if hasNow {
		if now >= d.due { // never when neither load nor time changes it (due: MaxInt64)
			return b.chooseAny(ctx, now, hasNow)
		}
	} else if d.recheck.Load() != 0 {
		return b.chooseIfDue(ctx, d)
	}
	return rrPick(d.rr, d.rrMod, b.rrCounter), now, nil
}

// rrPick is round robin's pick over rr, mod being its View.mod. Its
// arguments are read before the counter's add, which later loads would
// wait for.
func rrPick(rr []*Server, mod uint64, c *counter) *Server {
	i, _ := bits.Mul64(mod*uint64(uint32(c.n.Add(1))), uint64(len(rr)))
	return rr[i]
}

// chooseIfDue is choose's common case for a Choose whose decision may be
// due (time alone changes it, or the load changed since it was made, as
// it does under traffic): it reads the started balancer's coarse clock,
// one atomic load, as chooseZone would, and the decision stands until it
// is due. Apart from choose, so that choose sets up no frame for the call.
func (b *Balancer) chooseIfDue(ctx context.Context, d *zoneDecision) (*Server, int64, error) {
	if !b.sharedStats.coarse.Load() || coarse.nanotime() >= d.due {
		return b.chooseAny(ctx, 0, false)
	}
	return rrPick(d.rr, d.rrMod, b.rrCounter), 0, nil
}

// chooseAny is choose in every case: apart, so that choose's common case
// sets up no frame for the rest.
func (b *Balancer) chooseAny(ctx context.Context, now int64, hasNow bool) (*Server, int64, error) {
	snap := b.snap.Load()
	if snap.ramp != nil {
		now, hasNow = b.rampDue(snap, now, hasNow) // slowstart.go: wakes the refresher when due; reads only
	}
	if subsetsAsked.Load() { // checked here, not in the call: no context can carry a subset otherwise
		var err error
		if snap, err = b.snapshotFor(ctx); err != nil { // subset.go: the current snapshot, or a subset's
			return nil, now, err
		}
	}
	var v, c *View
	if d := snap.decision.Load(); d.draw == nil && !zonesForced.Load() &&
		(hasNow && now < d.due || !hasNow && !d.clockCheck() && !b.shared.zonesPending.Load()) {
		v, c = d.view, d.scope // chooseZone's answer, without its call: no draw, clock or refresh
	} else {
		v, c, now, hasNow = b.chooseZone(ctx, snap, now, hasNow)
	}
	var srv *Server
	switch {
	case len(v.servers) > 0 && (b.rr != nil || b.za != nil && b.za.pred.limit == 0 && b.shared.quiet()):
		// RoundRobin's Choose, or ZoneAvoidance's while every server
		// passes its predicate (its first round-robin position then:
		// roundRobinAvailable), with View.at written out: at does not
		// inline, and its call was a fifth of the pick in a profile.
		if k := b.rrCounter.n.Add(1); v.sweep == nil {
			srv = v.servers[v.index(k)]
		} else {
			srv = v.weightedAt(k)
		}
	case len(v.servers) > 0 && b.za != nil:
		// Field by field: a composite literal is built in a temporary and
		// copied, and the copy's wide loads of narrow stores stall (a
		// third of the pick in a profile).
		var p PickInfo
		p.Ctx, p.View, p.Candidates, p.b, p.now, p.hasNow = ctx, v, c, b, now, hasNow
		srv = b.za.choose(&p)
	default:
		var err error
		srv, err = b.rule.Choose(PickInfo{Ctx: ctx, View: v, Candidates: c, b: b, now: now, hasNow: hasNow})
		if srv == nil && err == nil && v != &snap.full {
			// Ribbon's ZoneAwareLoadBalancer: a zone that yields nothing
			// falls back to the whole list. A zone view always holds an
			// alive server, so only a rule that declines one gets here.
			full := &snap.full
			srv, err = b.rule.Choose(PickInfo{Ctx: ctx, View: full, Candidates: full, b: b, now: now, hasNow: hasNow})
		}
		if err != nil {
			return nil, now, err
		}
		if srv == nil {
			return nil, now, ErrNoServers
		}
	}
	if b.shared.ejectedUntilMax.Load() != 0 { // outlier detection ejected a server once
		srv, now = b.skipEjected(srv, snap, v, c, now, hasNow)
	}
	return srv, now, nil
}

// Pick chooses a server for one request, as Choose does, and starts the
// request in the server's statistics: report its outcome through the
// returned Pick (Done, or Responded then End). It is safe for concurrent
// use and, for the simple rules, takes no lock and allocates nothing.
//
// It reads the time once, for the zone decision, the rule and the
// request's start together (twice under Retry, whose pick may wait): the
// system clock, to time the request for a Done without a ResponseTime,
// unless the balancer was built WithoutPickTiming, in which case a
// started balancer reads the coarse clock, an atomic load (see Start).
func (b *Balancer) Pick(ctx context.Context) (Pick, error) {
	srv, now, err := b.choose(ctx, b.shared.pickTime(), true)
	if err != nil {
		return Pick{}, err
	}
	if srv.inst == nil {
		return Pick{Server: srv}, nil
	}
	if b.ruleWaits {
		now = b.shared.pickTime()
	}
	return Pick{Server: srv, start: srv.inst.own().requestStartedAt(now)}, nil
}

// Begin starts a request to s, a server of this balancer the caller chose
// itself (with Choose, or from ReachableServers: a same-server retry, a
// fail-over outside the rule), and returns its Pick. A server that did
// not come from a balancer gets a Pick that records nothing.
func (b *Balancer) Begin(s *Server) Pick {
	if s == nil || s.inst == nil {
		return Pick{Server: s}
	}
	return Pick{Server: s, start: s.inst.own().requestStarted()}
}

// PickInfo is everything a [Rule] chooses from for one pick: the
// candidates, already narrowed by the zone choice, the caller's context,
// and (through its methods) the balancer's randomness and clock. The balancer builds one per
// pick and hands it to the rule by value; a rule needs nothing else, so
// rules can be written outside this package.
//
// The methods with a pointer receiver cache the pick's time: call them on
// the rule's own copy (the parameter), not on a temporary.
type PickInfo struct {
	// Ctx is the caller's context. It carries the key of WithKey (see
	// Key), and its deadline and cancellation bound a rule that waits, as
	// Retry does. It is never nil.
	Ctx context.Context
	// View is the servers to choose from: the zone the zone choice settled
	// on (a zone forced with WithZone, or the one the zone-aware choice
	// drew), or all of Candidates when no zone was chosen. It is empty only
	// when the balancer has no alive server.
	View *View
	// Candidates is every server this pick may use: the alive servers the
	// zone filter (ZoneAffinity, ZonePreference) keeps, or the forced
	// zone's. It is View itself when no zone was chosen. A rule whose test
	// fails every server of View may fall back to it, as ZoneAvoidance does.
	Candidates *View

	// The balancer, for its clock, randomness and Refresh; nil in a
	// hand-made PickInfo. PickInfo is kept to a few words so that a rule's
	// call passes it in registers.
	b      *Balancer
	now    int64
	hasNow bool
}

// Rand returns the balancer's randomness (WithRand, by default math/rand/v2's
// global source); it is safe for concurrent use.
func (p *PickInfo) Rand() Rand {
	if p.b == nil {
		return globalRand{}
	}
	return p.b.rnd
}

// Now returns the pick's time on the balancer's clock (WithClock), as a
// monotonic duration since a fixed origin: only differences between two
// readings mean something. It reads the clock at most once per pick; the
// zone choice may already have. On the system clock, a started balancer
// reads the coarse clock, exact to about a millisecond, unless the pick
// times its request (see WithoutPickTiming).
func (p *PickInfo) Now() time.Duration { return time.Duration(p.nanotime()) }

func (p *PickInfo) nanotime() int64 {
	if !p.hasNow && p.b != nil {
		p.now, p.hasNow = p.b.shared.coarseNanotime(), true
	}
	return p.now
}

// Key returns the key set on Ctx with WithKey, for keyed rules.
func (p *PickInfo) Key() (string, bool) { return KeyFrom(p.Ctx) }

// Tripped reports whether s is unavailable at the pick's time: its
// circuit breaker is open, or outlier detection ejected it; never in
// panic (Config.PanicThreshold). It reads the clock only for a server
// whose failures reached the threshold, or once a server was ejected.
func (p *PickInfo) Tripped(s *Server) bool {
	if s.inst == nil {
		return false
	}
	st := s.inst.view()
	if b := p.b; b != nil && (b.shared.quiet() || b.shared.noneUnavailableNow(p)) {
		return false // s need not be read: at N=10,000, a cache miss per pick
	}
	now := p.nanotime()
	return st.trippedAt(now) || st.ejectedAt(now)
}

// ActiveRequests returns s's requests in flight at the pick's time (see
// ServerStats.ActiveRequests).
func (p *PickInfo) ActiveRequests(s *Server) int64 {
	if s.inst == nil {
		return 0
	}
	return s.inst.view().activeAt(p.nanotime())
}

// Changed returns a channel that is closed when the balancer's list has
// changed since this pick's View was taken: a rule that waits (Retry)
// waits on it together with Ctx, then calls Refresh. It is nil, so never
// ready, for a hand-made PickInfo.
func (p *PickInfo) Changed() <-chan struct{} {
	if p.View == nil || p.View.snap == nil {
		return nil
	}
	return p.View.snap.replaced
}

// Refresh returns the PickInfo of the same pick over the balancer's
// current list, with the zone choice made again and a fresh time. A
// hand-made PickInfo is returned as is.
func (p *PickInfo) Refresh() PickInfo {
	if p.b == nil {
		return *p
	}
	snap, _ := p.b.snapshotFor(p.Ctx) // a failed subset: an empty one
	return p.b.pickInfo(p.Ctx, snap)
}

// Pick is a server chosen for one request, together with that request's
// entry in the server's statistics: from the pick on, the request counts
// as active (for BestAvailable, the availability limit and the zone
// statistics) until it ends. [Balancer.Pick] makes one, and
// [Balancer.Begin] makes one for a server the caller chose itself.
//
// Report the outcome exactly once, in one of two ways:
//
//   - Done(info) when the exchange is over: a failure (with whether it
//     was a connection failure, which feeds the circuit breaker) or an
//     answer (with its response time);
//   - Responded(d) when the answer starts (an HTTP response's headers),
//     then End() when it is over (the body read or closed): the response
//     time is taken at the start of the answer, and the request stays
//     active while the answer streams, so streams count as load.
//
// End alone ends a request without recording an outcome, for a pick that
// was never sent. A request never ended stays active until the
// active-request timeout (Config.ActiveRequestsTimeout) decays its count.
//
// A Pick is a small value: copy it freely (lbhttp keeps one in each
// response body), but report once. Its methods are safe to call from any
// goroutine. The zero Pick has no Server and its methods do nothing.
type Pick struct {
	// Server is the chosen server. It is shared: do not modify it.
	Server *Server
	start  int64 // the balancer's nanotime at the pick
}

// DoneInfo is the outcome of a request, for [Pick.Done].
type DoneInfo struct {
	// Err is why the request failed, nil when the server answered. Any
	// answer counts as one, whatever it says (an HTTP 500 included): the
	// server is reachable.
	Err error
	// ConnectFailure reports that the request failed to connect, so
	// nothing reached the server: refused, unreachable, connect timeout. It
	// counts towards the server's circuit breaker; other failures only end
	// the request. It means a failure even when Err is nil.
	ConnectFailure bool
	// ResponseTime is how long the server took to answer, for the
	// response-time average; zero means the time since the pick on the
	// balancer's clock, or no response time under WithoutPickTiming. It
	// is ignored for a failure.
	ResponseTime time.Duration
	// ServerError reports an answer that is a server error: an HTTP 5xx,
	// a gRPC status that says the server failed (Internal, Unknown,
	// DataLoss, Unavailable once something was received). It is an answer
	// for the breaker (the server is reachable) and counts towards
	// outlier detection (Config.OutlierDetection); any other answer resets
	// that count. It is ignored for a failure.
	ServerError bool
}

// stats returns the statistics the pick records into, or nil.
func (p Pick) stats() *ServerStats {
	if p.Server == nil || p.Server.inst == nil {
		return nil
	}
	return p.Server.inst.own()
}

// Done records the outcome of the request and ends it. An answer resets
// the server's successive-failure count (closing its breaker) and feeds
// its response-time average; a connection failure counts towards its
// breaker. Call it at most once, and not after Responded.
func (p Pick) Done(info DoneInfo) {
	st := p.stats()
	if st == nil {
		return
	}
	if info.Err != nil || info.ConnectFailure {
		st.requestFailed(info.ConnectFailure)
		return
	}
	now, read := p.answer(st, info.ResponseTime, info.ServerError)
	if !read {
		now = st.shared.coarseNanotime()
	}
	st.endRequestAt(now)
}

// Responded records that the server answered after d (zero: the time
// since the pick, or none under WithoutPickTiming), as Done does for an answer, but leaves the request
// active: call End when the answer is over. Call it at most once, and not
// with Done.
func (p Pick) Responded(d time.Duration) { p.RespondedWith(DoneInfo{ResponseTime: d}) }

// RespondedWith is Responded for an answer described by info: its
// response time (zero as for Responded) and whether it is a server error.
// info.Err and info.ConnectFailure are ignored: it records an answer.
func (p Pick) RespondedWith(info DoneInfo) {
	if st := p.stats(); st != nil {
		p.answer(st, info.ResponseTime, info.ServerError)
	}
}

// End ends the request: after Responded, when the answer is over; alone,
// for a request that was never sent (nothing is recorded but the end).
// Call it at most once.
func (p Pick) End() {
	if st := p.stats(); st != nil {
		st.endRequest()
	}
}

// answer records an answer that took d, or, when d is zero, the time
// since the pick when the balancer times its picks, and no response time
// when it does not (WithoutPickTiming). It returns the system clock's
// time when it read it: one reading serves the response time and the
// request's end.
func (p Pick) answer(st *ServerStats, d time.Duration, serverError bool) (now int64, read bool) {
	timed := d != 0
	if !timed && st.shared.timed {
		now, read, timed = st.shared.nanotime(), true, true
		d = time.Duration(max(now-p.start, 0))
	}
	if timed {
		st.responseReceived(d)
	} else {
		st.answered()
	}
	if serverError {
		st.serverError()
	} else {
		st.goodAnswer()
	}
	return now, read
}
