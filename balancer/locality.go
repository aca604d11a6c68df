package balancer

import (
	"cmp"
	"slices"
	"strings"
)

// Regions: a balancer with a Region orders its servers into tiers by
// region, Envoy's locality priorities: its own region's servers (Region
// empty or equal to Config.Region) first, then the regions of
// Config.RegionPriority in order, then any other region in name order.
// Picks go to the first tier that has a reachable server (alive, breaker
// closed, not ejected: what the zone statistics count as not tripped);
// within that tier the zone filter (its own region only: the client's zone
// is there), zone avoidance, the panic threshold and the rule work as over
// a balancer of that tier alone. When no tier has a reachable server the
// first tier with servers is used, as the zone filters fall back. The tier
// is part of the zone decision (zone.go), so it is remade when a list
// changes and when a breaker trips or resets: a region whose last server
// trips fails over at once, and back once one of its breakers closes.
//
// Config.LocalRegionOnly keeps a service in its region: the servers of
// other regions are left out of its list (SetServers takes them without
// error and lists them nowhere).
//
// Zone names are taken as unique across regions, as cloud zones are
// (eu-west-1a); a zone name two regions share is one zone to the zone
// logic.

// locality is a balancer's region settings, nil without Config.Region.
type locality struct {
	own       string         // lower case
	rank      map[string]int // lower-case region -> its place in RegionPriority, from 1
	localOnly bool
}

func newLocality(cfg *Config) *locality {
	if cfg.Region == "" {
		return nil
	}
	l := &locality{own: lowerASCII(cfg.Region), rank: make(map[string]int, len(cfg.RegionPriority)), localOnly: cfg.LocalRegionOnly}
	for i, r := range cfg.RegionPriority {
		l.rank[lowerASCII(r)] = i + 1
	}
	return l
}

// key returns the region key of a server's Region: lower case, the own
// region's for an empty one.
func (l *locality) key(region string) string {
	if region == "" {
		return l.own
	}
	return lowerASCII(region)
}

// excludes reports whether a server of region is left out of the list:
// another region's, under LocalRegionOnly.
func (l *locality) excludes(region string) bool {
	return l != nil && l.localOnly && l.key(region) != l.own
}

// compare orders region keys by tier: the own region, then by rank, then
// by name.
func (l *locality) compare(a, b string) int {
	if a == b {
		return 0
	}
	if a == l.own || b == l.own {
		if a == l.own {
			return -1
		}
		return 1
	}
	ra, rb := l.rank[a], l.rank[b]
	switch {
	case ra != 0 && rb != 0:
		return cmp.Compare(ra, rb)
	case ra != 0:
		return -1
	case rb != 0:
		return 1
	}
	return strings.Compare(a, b)
}

// regionTier is the alive servers of one region in a snapshot.
type regionTier struct {
	name string // lower case
	view View
	// pure reports that the tier's zones hold its servers alone: no zone
	// name is shared with another region (servers without a zone, in
	// several regions, share the empty one). Only then do the zone filter
	// and zone avoidance work within the tier; otherwise a pick goes round
	// the tier's servers, zones aside.
	pure bool
}

// tiersOf groups s's alive servers by region, nearest first (r: the live
// weights, as buildSnapshot's). It returns nil when they are all of one
// region: the snapshot's full view is then the only tier.
func (l *locality) tiersOf(s *Snapshot, r *ramp) []*regionTier {
	if l == nil || len(s.full.servers) == 0 {
		return nil
	}
	first := l.key(s.full.servers[0].Region)
	one := true
	for _, srv := range s.full.servers[1:] {
		if l.key(srv.Region) != first {
			one = false
			break
		}
	}
	if one {
		return nil
	}
	byName := map[string]*regionTier{}
	zonesOf := map[*regionTier]map[string]bool{} // the zones each tier's servers are in
	var tiers []*regionTier
	for _, srv := range s.full.servers {
		k := l.key(srv.Region)
		t := byName[k]
		if t == nil {
			t = &regionTier{name: k}
			t.view.snap = s
			byName[k] = t
			zonesOf[t] = map[string]bool{}
			tiers = append(tiers, t)
		}
		t.view.servers = append(t.view.servers, srv)
		zonesOf[t][srv.zoneKey()] = true
	}
	slices.SortFunc(tiers, func(a, b *regionTier) int { return l.compare(a.name, b.name) })
	weighted := s.full.wt != nil
	for _, t := range tiers {
		t.view.setServers(t.view.servers)
		inZones := 0
		for _, g := range s.zones { // in the snapshot's zone order
			if zonesOf[t][g.name] {
				t.view.zones = append(t.view.zones, g)
				inZones += len(g.view.servers)
			}
		}
		t.pure = inZones == len(t.view.servers)
		if weighted {
			t.view.setWeights(r)
		}
	}
	return tiers
}

// chooseTier returns the nearest tier of s with a reachable server at now
// (alive, as every server of a snapshot's views is; breaker closed; not
// ejected), or the first tier when none has one; nil when s has no tiers.
// It reads the servers of the tiers before the one it returns, and that
// tier's until its first reachable one.
func (s *Snapshot) chooseTier(now int64) *regionTier {
	if s.tiers == nil {
		return nil
	}
	for _, t := range s.tiers {
		for _, srv := range t.view.servers {
			if st := srv.inst.view(); !st.trippedAt(now) && !st.ejectedAt(now) {
				return t
			}
		}
	}
	return s.tiers[0]
}

// NearestServers returns the alive servers of the nearest region that has
// a reachable server (Config.Region), as picks choose it now: all of
// ReachableServers without regions. What answers for the balancer
// without picking (the dns package) takes it, so that it fails over
// between regions as picks do. The slice is shared: do not modify it.
func (b *Balancer) NearestServers() []*Server {
	snap := b.snap.Load()
	if t := snap.chooseTier(b.shared.nanotime()); t != nil {
		return t.view.servers
	}
	return snap.full.servers
}

// RegionOrder is the order in which a balancer of region own, with
// priority as its RegionPriority, fails over between regions (the own
// region first, an empty name counting as it; then priority's; then the
// others by name), as a comparison of region names without regard to case:
// for an adapter that orders localities itself (the xds module). Without
// own every region compares equal.
func RegionOrder(own string, priority []string) func(a, b string) int {
	l := newLocality(&Config{Region: own, RegionPriority: priority})
	if l == nil {
		return func(string, string) int { return 0 }
	}
	return func(a, b string) int { return l.compare(l.key(a), l.key(b)) }
}
