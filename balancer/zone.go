package balancer

import "math/bits"

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
