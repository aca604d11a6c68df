package balancer

import "slices"

// zoneFilter narrows the servers a pick considers: all of them, or those
// of the client's zone. It is Ribbon's ServerListFilter, evaluated with the
// zone decision (zone.go) from the zone statistics instead of once per
// poll, so its decisions follow load and failures within
// Config.ZoneStatsInterval even when the list is pushed and never polled.
// It is configured by Config.Filter only: its scope must be a view of the
// snapshot, which only this package can name.
type zoneFilter struct {
	kind string // FilterNone, FilterZoneAffinity or FilterZonePreference
	zone string // the client's zone, lower case; empty turns filtering off
	// affinity holds ZoneAffinity's thresholds.
	affinity ZoneAffinityConfig
}

// newZoneFilter builds the named filter for cfg. Names are those of the
// Filter constants or Ribbon's class names.
func newZoneFilter(name string, cfg *Config) (*zoneFilter, error) {
	canon, err := canonicalFilter(name)
	if err != nil {
		return nil, err
	}
	f := &zoneFilter{kind: canon, zone: lowerASCII(cfg.Zone), affinity: cfg.ZoneAffinity}
	if canon == FilterZoneAffinity && !f.affinity.Enabled && !f.affinity.Exclusive {
		f.kind = FilterNone
	}
	if f.zone == "" {
		f.kind = FilterNone
	}
	return f, nil
}

// needsStats reports whether scope reads the zone statistics, so that its
// result changes with load; NoFilter and ZonePreference do not.
func (f *zoneFilter) needsStats() bool {
	return f.kind == FilterZoneAffinity && !f.affinity.Exclusive
}

// scope returns base (the full view, or the nearest region's: locality.go)
// or the view of the client's zone, when base holds it. stats holds the
// statistics of every zone of s, by zoneGroup.idx.
//
//   - None (Ribbon's DefaultNIWSServerListFilter) keeps every server.
//   - ZoneAffinity (Ribbon's ZoneAffinityServerListFilter) keeps the
//     servers of the client's zone: always with Exclusive; with Enabled
//     only, unless the zone is in trouble (tripped/count >=
//     MaxBlackoutPercentage, load per server >= MaxLoadPerServer, or fewer
//     than MinAvailableServers non-tripped servers).
//   - ZonePreference (Spring Cloud's default) keeps the servers of the
//     client's zone when it has any.
//
// When the client's zone has no alive server at all, every filter keeps
// every server: Ribbon's ZoneAffinity would return an empty list and fail
// every request while the local zone is empty. So does ZonePreference, and
// ZoneAffinity without Exclusive, when every alive server of the zone has
// its circuit breaker open: a pick would otherwise go to a tripped server
// first, on every request, before its retry crossed to another zone. The
// decision is remade when a breaker trips or resets, so the zone is
// preferred again once a blackout ends (its server then gets the one
// request that probes it).
func (f *zoneFilter) scope(s *Snapshot, stats []ZoneSnapshot, base *View) *View {
	if f.kind == FilterNone {
		return base
	}
	g := s.group(f.zone)
	if g == nil || !slices.Contains(base.zones, g) {
		return base
	}
	exclusive := f.kind == FilterZoneAffinity && f.affinity.Exclusive
	if st := stats[g.idx]; !exclusive && st.InstanceCount > 0 && st.TrippedCount >= st.InstanceCount {
		return base
	}
	if f.needsStats() {
		st := stats[g.idx]
		if float64(st.TrippedCount)/float64(st.InstanceCount) >= f.affinity.MaxBlackoutPercentage ||
			st.LoadPerServer >= f.affinity.MaxLoadPerServer ||
			st.InstanceCount-st.TrippedCount < f.affinity.MinAvailableServers {
			return base
		}
	}
	return &g.view
}
