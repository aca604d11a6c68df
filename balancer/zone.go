package balancer

import (
	"context"
	"math"
	"math/bits"
	"sync/atomic"
)

// zoneDecision is the zone choice of every pick over one snapshot, made off
// the pick path and published with the snapshot (Snapshot.decision), as
// grpc-go regenerates a picker: a pick loads it and reads it, and only the
// draw of a zone, when there is one, is made per pick, with one random
// number over precomputed cumulative weights.
//
// It is made again when one of its inputs changes:
//
//   - a list change builds the next snapshot with its decision;
//   - a breaker that trips or resets remakes it at once, from the
//     goroutine that reported the failure or the answer;
//   - load: when active counts change (a request starts or ends) and the
//     decision is ZoneStatsInterval old, by that request's start or end, or
//     by a Pick, which reads the clock anyway;
//   - time alone, while a breaker is open (its blackout ends) or a count
//     may decay: a pick reads the clock and remakes it when due.
//
// So a Choose reads no clock unless a breaker is open or load changed since
// the decision was made; Pick reads it once, for the decision and the
// request's start together.
type zoneDecision struct {
	// What Balancer.choose's common case reads comes first, together.
	//
	// rr and rrMod are view's servers and their reciprocal (View.mod) when
	// a pick may take them from the decision alone (Balancer.choose): the
	// rule is RoundRobin, or ZoneAvoidance without an active-request limit
	// (its predicate then keeps every server while none is tripped:
	// rrQuiet), no zone is drawn per pick, no server ramps
	// (Snapshot.ramp) and the weights are equal; rr is nil otherwise.
	rr    []*Server
	rrMod uint64
	// due is when load or time may have changed it: at plus
	// ZoneStatsInterval, or math.MaxInt64 when neither matters to it.
	due int64
	// recheck is not 0 when a Choose, which reads no clock otherwise, must
	// read it to see whether the decision is due: recheckClock when time
	// alone changes it (set when it is made), recheckLoad once an active
	// count changed after it was made (statsShared.zonesPending, which
	// the balancer's current decision mirrors here: markLoadChanged). One
	// word, so that choose's common case tests one.
	recheck atomic.Uint32
	rrQuiet bool

	at int64 // nanotime it was made at
	// usable[i] reports that zone snap.zones[i] has a server whose breaker
	// is closed, for a zone forced with WithZone.
	usable []bool
	scope  *View // the zone filter's candidates
	// view is what a pick uses when no zone is drawn per pick.
	view *View
	// draw and cum, when draw is not nil: a pick draws zone draw[i] with
	// probability (cum[i] - cum[i-1]) / cum[len-1].
	draw []*zoneGroup
	cum  []int
	// panic: too few healthy servers (Config.PanicThreshold), so the
	// decision and the picks ignore breakers and ejections; healthy and
	// alive are the counts it was decided on (outlier.go).
	panic          bool
	healthy, alive int
}

// The bits of zoneDecision.recheck.
const (
	recheckClock = 1 << iota
	recheckLoad
)

// clockCheck reports that time alone changes the decision (a breaker is
// open, an active count may decay): a Choose reads the clock to check due.
func (d *zoneDecision) clockCheck() bool { return d.recheck.Load()&recheckClock != 0 }

// drawScale is the total weight of a draw whose probabilities are not
// ratios of instance counts (several worst zones, one dropped at random):
// fine enough to be exact in practice, small enough for IntN on 32 bits.
const drawScale = 1 << 30

// maxZoneAwareZones is the number of zones the zone-aware logic handles
// with a bit set; beyond it (an unusual topology) zones are not avoided.
const maxZoneAwareZones = 64

// pickInfo makes the zone choice of one pick and returns what the rule
// chooses from (see chooseZone).
func (b *Balancer) pickInfo(ctx context.Context, snap *Snapshot) PickInfo {
	v, c, now, hasNow := b.chooseZone(ctx, snap, 0, false)
	return PickInfo{Ctx: ctx, View: v, Candidates: c, b: b, now: now, hasNow: hasNow}
}

// chooseZone applies the snapshot's zone decision to one pick:
//
//  1. a zone forced with WithZone, when it has a server whose breaker is
//     closed: only that zone;
//  2. otherwise the zone filter's scope (Candidates), and, when zones are
//     avoided, the scope spans several and some are not available, one
//     zone drawn from the available ones (View): Ribbon's
//     ZoneAwareLoadBalancer and ZoneAvoidanceRule.getAvailableZones. When
//     every zone is available the view is the whole scope, over which the
//     rule goes round robin, as Ribbon's ZoneAvoidanceRule does over the
//     servers its zone predicate keeps (all of them, then).
//
// now is the pick's time when hasNow (Pick reads it); otherwise the clock
// is read only when the decision may be out of date. It returns the parts
// of the PickInfo rather than filling one, so that Choose builds the
// PickInfo right in the rule's call: no copies, no write barriers.
func (b *Balancer) chooseZone(ctx context.Context, snap *Snapshot, now int64, hasNow bool) (view, candidates *View, _ int64, _ bool) {
	if len(snap.full.servers) == 0 {
		return &snap.full, &snap.full, now, hasNow
	}
	d := snap.decision.Load()
	if !hasNow && (d.clockCheck() || b.shared.zonesPending.Load()) {
		now, hasNow = b.shared.coarseNanotime(), true
	}
	if hasNow && now >= d.due {
		b.refreshZonesDue(now)
		d = snap.decision.Load()
	}
	if !zonesForced.Load() {
		// No context carries a forced zone (context.go).
	} else if zone, forced := ZoneFrom(ctx); forced {
		if g := snap.group(lowerASCII(zone)); g != nil && d.usable[g.idx] {
			return &g.view, &g.view, now, hasNow
		}
	}
	if d.draw != nil {
		return d.drawZone(b.rnd), d.scope, now, hasNow
	}
	return d.view, d.scope, now, hasNow
}

// drawZone draws one zone with one random number. It counts the
// cumulative weights at or below the draw rather than searching: zones are
// few, and a count has no branch to mispredict on a random number.
func (d *zoneDecision) drawZone(r Rand) *View {
	x := intN(r, d.cum[len(d.cum)-1])
	i := 0
	for _, c := range d.cum {
		i += int(uint64(c-x-1) >> 63) // x >= c; weights are below 2^31
	}
	return &d.draw[i].view
}

// decideZones makes the zone decision over snap at now, from fresh zone
// statistics: O(servers).
func (b *Balancer) decideZones(snap *Snapshot, now int64) *zoneDecision {
	d := &zoneDecision{at: now, due: math.MaxInt64, scope: &snap.full, view: &snap.full}
	if len(snap.zones) == 0 {
		return d
	}
	stats := make([]ZoneSnapshot, len(snap.zones))
	d.usable = make([]bool, len(snap.zones))
	tripped, active := false, false
	for i, g := range snap.zones {
		stats[i] = zoneSnapshotOf(g.view.servers, now, false)
		tripped = tripped || stats[i].TrippedCount > 0
	}
	// The nearest region with a reachable server (locality.go): the base
	// of the filter's scope, and of the panic threshold.
	base, zonesOK := &snap.full, true
	panicStats := stats
	if t := snap.chooseTier(now); t != nil {
		base, zonesOK = &t.view, t.pure
		panicStats = []ZoneSnapshot{zoneSnapshotOf(t.view.servers, now, false)}
	}
	if d.panic, d.healthy, d.alive = b.panicOf(panicStats); d.panic {
		// Every alive server counts as healthy, its load included.
		for i, g := range snap.zones {
			stats[i] = zoneSnapshotOf(g.view.servers, now, true)
		}
	}
	for i, st := range stats {
		d.usable[i] = st.TrippedCount < st.InstanceCount
		active = active || st.ActiveRequests > 0
	}
	d.scope = base
	if zonesOK {
		d.scope = b.filter.scope(snap, stats, base)
	}
	d.view = d.scope
	loadMatters := b.filter.needsStats()
	if zones := d.scope.zones; zonesOK && b.avoidZones && len(zones) > 1 && len(zones) <= maxZoneAwareZones {
		loadMatters = true
		b.avoidZonesOf(d, zones, stats)
	}
	if loadMatters || tripped {
		d.due = now + int64(b.cfg.ZoneStatsInterval)
	}
	if tripped || (loadMatters && active) {
		d.recheck.Store(recheckClock)
	}
	za := b.za != nil && b.za.pred.limit == 0 && b.shared.breaker.Threshold > 0 // statsShared.quiet's fixed half
	if (b.rr != nil || za) && d.draw == nil && snap.ramp == nil && d.view.sweep == nil && len(d.view.servers) > 0 {
		d.rr, d.rrMod, d.rrQuiet = d.view.servers, d.view.mod, za
	}
	return d
}

// avoidZonesOf sets d's draw as Ribbon's ZoneAvoidanceRule.getAvailableZones
// then randomChooseZone would choose, over the zone statistics:
//
//  1. zones with no instance, with a blacked-out share of tripped servers
//     (>= BlackoutPercentage) or all servers tripped are dropped;
//  2. if the worst load per server is below TriggeringLoadPerServer and
//     nothing was dropped, every zone is available: no draw, the pick uses
//     the whole scope (ZoneAwareLoadBalancer falls back to the whole list;
//     ZoneAvoidanceRule's zone predicate keeps every server);
//  3. otherwise one of the worst zones (highest load per server, ties
//     within 1e-6) is dropped, chosen at random weighted by instance
//     count, and a zone is drawn from the others weighted by instance
//     count.
//
// "Weighted by instance count" is by live weight (drawWeight) when the
// servers' weights differ. Both choices are random per pick in Ribbon; here they are one
//
//	draw over their combined probabilities, which are the same.
//
// Unlike Ribbon, step 3 never drops the last remaining zone.
func (b *Balancer) avoidZonesOf(d *zoneDecision, zones []*zoneGroup, stats []ZoneSnapshot) {
	var avail, worst uint64
	limited := false
	maxLoad := 0.0
	for i, g := range zones {
		st := stats[g.idx]
		if st.InstanceCount == 0 || st.LoadPerServer < 0 ||
			float64(st.TrippedCount)/float64(st.InstanceCount) >= b.cfg.ZoneAvoidance.BlackoutPercentage {
			limited = true
			continue
		}
		avail |= 1 << i
		switch load := st.LoadPerServer; {
		case load-maxLoad < 1e-6 && maxLoad-load < 1e-6:
			worst |= 1 << i
		case load > maxLoad:
			maxLoad = load
			worst = 1 << i
		}
	}
	if avail == 0 {
		return // nothing available: every candidate
	}
	if maxLoad < b.cfg.ZoneAvoidance.TriggeringLoadPerServer && !limited {
		return
	}
	if bits.OnesCount64(avail) == 1 || worst == 0 {
		d.setDraw(zones, avail, nil)
		return
	}
	if bits.OnesCount64(worst) == 1 {
		d.setDraw(zones, avail&^worst, nil)
		return
	}
	// Several worst zones: zone z is drawn with probability
	// sum over worst d != z of P(drop d) x n_z / (n_avail - n_d).
	nAvail, nWorst := 0.0, 0.0
	for i, g := range zones {
		n := float64(g.drawWeight())
		if avail&(1<<i) != 0 {
			nAvail += n
		}
		if worst&(1<<i) != 0 {
			nWorst += n
		}
	}
	p := make([]float64, len(zones))
	for j, dropped := range zones {
		if worst&(1<<j) == 0 {
			continue
		}
		nd := float64(dropped.drawWeight())
		for i, g := range zones {
			if i != j && avail&(1<<i) != 0 {
				p[i] += nd / nWorst * float64(g.drawWeight()) / (nAvail - nd)
			}
		}
	}
	d.setDraw(zones, avail, p)
}

// drawWeight is what a zone weighs in zone draws: its live weight (the sum
// of its alive servers' weights) when the snapshot's weights differ, its
// instance count when they are equal (the same ratios, Ribbon's numbers).
func (g *zoneGroup) drawWeight() int {
	if g.weight > 0 {
		return g.weight
	}
	return len(g.view.servers)
}

// setDraw makes the draw over the zones of set: weighted by instance count,
// or by p (probabilities) when not nil. A set of one zone needs no draw.
func (d *zoneDecision) setDraw(zones []*zoneGroup, set uint64, p []float64) {
	if bits.OnesCount64(set) == 1 {
		d.view = &zones[bits.TrailingZeros64(set)].view
		return
	}
	total := 0
	for i, g := range zones {
		if set&(1<<i) == 0 {
			continue
		}
		w := g.drawWeight()
		if p != nil {
			w = int(math.Round(p[i] * drawScale))
		}
		if w <= 0 {
			continue
		}
		total += w
		d.draw = append(d.draw, g)
		d.cum = append(d.cum, total)
	}
	if len(d.draw) == 1 {
		d.view, d.draw, d.cum = &d.draw[0].view, nil, nil
	}
}

// refreshZones remakes the zone decision of the current snapshot at once:
// a breaker tripped or reset. Calls that arrive while it is being made are
// folded into one more round, so a burst of trips costs a few rounds, not
// one each; none is lost.
func (b *Balancer) refreshZones() {
	b.zonesAgain.Store(true)
	for b.zonesAgain.Load() && b.zonesRefreshing.CompareAndSwap(false, true) {
		for b.zonesAgain.Swap(false) {
			b.publishZones(b.snap.Load())
		}
		b.zonesRefreshing.Store(false)
	}
}

// refreshZonesDue remakes the zone decision if it is still due at now; a
// decision being made meanwhile will do.
func (b *Balancer) refreshZonesDue(now int64) {
	if !b.zonesRefreshing.CompareAndSwap(false, true) {
		return
	}
	if now >= b.shared.zonesDue.Load() {
		b.publishZones(b.snap.Load())
	}
	b.zonesRefreshing.Store(false)
	if b.zonesAgain.Load() {
		b.refreshZones() // a breaker changed meanwhile
	}
}

// publishZones makes and installs snap's zone decision. Called by one
// goroutine at a time (zonesRefreshing) or with b.mu held for a snapshot
// not yet installed.
func (b *Balancer) publishZones(snap *Snapshot) {
	b.shared.zonesPending.Store(false)
	d := b.decideZones(snap, b.shared.nanotime())
	snap.decision.Store(d)
	b.syncDecision()
	b.recheckIfLoadChanged()
	if b.snap.Load() == snap {
		b.shared.zonesDue.Store(d.due)
		b.notePanic(d)
	}
}
