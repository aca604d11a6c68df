package balancer

import (
	"context"
	"math/bits"
)

// pickInfo makes the zone choice of one pick, the only place it is made,
// and returns what the rule chooses from:
//
//  1. a zone forced with WithZone, when it has a server whose breaker is
//     closed: only that zone;
//  2. otherwise the zone filter's scope (Candidates), and when zones are
//     avoided (Config.ZoneAware, or a rule such as ZoneAvoidance that asks
//     for a zone on every pick) and the scope spans several zones, one
//     zone drawn from the available ones (View): Ribbon's
//     ZoneAwareLoadBalancer and ZoneAvoidanceRule.getAvailableZones in one
//     step. ZoneAware alone draws a zone only when some zone is avoided;
//     a rule that asks for a zone gets one on every pick.
//
// The clock is read once, and only when something needs statistics, so
// the simple single-zone pick stays free of it.
func (b *Balancer) pickInfo(ctx context.Context, snap *Snapshot) PickInfo {
	v, c, now, hasNow := b.chooseZone(ctx, snap)
	return PickInfo{Ctx: ctx, View: v, Candidates: c, b: b, now: now, hasNow: hasNow}
}

// chooseZone is pickInfo's work. It returns the parts of the PickInfo
// rather than filling one, so that Choose builds the PickInfo right in the
// rule's call: no copies, no write barriers on the pick path.
func (b *Balancer) chooseZone(ctx context.Context, snap *Snapshot) (view, candidates *View, now int64, hasNow bool) {
	if len(snap.full.servers) == 0 {
		return &snap.full, &snap.full, 0, false
	}
	zone, forced := ZoneFrom(ctx)
	if forced || b.filterNeedsClock || (b.avoidZones && len(snap.zones) > 1) {
		now, hasNow = b.shared.nanotime(), true
	}
	if forced {
		if g := snap.byZone[lowerASCII(zone)]; g != nil {
			if st := b.zoneStats(g, now); st.TrippedCount < st.InstanceCount {
				return &g.view, &g.view, now, hasNow
			}
		}
	}
	c := b.filter.scope(b, snap, now)
	if b.avoidZones && len(c.zones) > 1 {
		if avail, limited := b.availableZones(c.zones, now); avail != 0 && (limited || b.zonePerPick) {
			return &b.weightedZone(c.zones, avail).view, c, now, hasNow
		}
	}
	return c, c, now, hasNow
}

// maxZoneAwareZones is the number of zones the zone-aware logic handles
// with a bit set; beyond it (an unusual topology) zones are not avoided.
const maxZoneAwareZones = 64

// availableZones computes the zones to use as Ribbon's
// ZoneAvoidanceRule.getAvailableZones does, over cached zone statistics:
//
//  1. zones with no instance, with a blacked-out share of tripped servers
//     (>= BlackoutPercentage) or all servers tripped are dropped;
//  2. if the worst load per server is below TriggeringLoadPerServer and
//     nothing was dropped, every zone is available;
//  3. otherwise one of the worst zones (highest load per server, ties
//     within 1e-6) is dropped, chosen at random weighted by instance count.
//
// Unlike Ribbon, step 3 never drops the last remaining zone. The result is
// a bit set over zones; limited reports that some zone was dropped.
func (b *Balancer) availableZones(zones []*zoneGroup, now int64) (avail uint64, limited bool) {
	if len(zones) > maxZoneAwareZones {
		return 0, false
	}
	if len(zones) == 1 {
		return 1, false
	}
	var worst uint64
	maxLoad := 0.0
	for i, g := range zones {
		st := b.zoneStats(g, now)
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
	if maxLoad < b.cfg.ZoneAvoidance.TriggeringLoadPerServer && !limited {
		return avail, false
	}
	if bits.OnesCount64(avail) > 1 && worst != 0 {
		drop := b.weightedZone(zones, worst)
		for i, g := range zones {
			if g == drop {
				avail &^= 1 << i
			}
		}
	}
	return avail, true
}

// weightedZone picks one zone of the set at random, weighted by instance
// count, as Ribbon's randomChooseZone does.
func (b *Balancer) weightedZone(zones []*zoneGroup, set uint64) *zoneGroup {
	total := 0
	var last *zoneGroup
	for i, g := range zones {
		if set&(1<<i) != 0 {
			total += len(g.view.servers)
			last = g
		}
	}
	if total == 0 {
		return last
	}
	r := b.rnd.IntN(total)
	for i, g := range zones {
		if set&(1<<i) == 0 {
			continue
		}
		if r < len(g.view.servers) {
			return g
		}
		r -= len(g.view.servers)
	}
	return last
}
