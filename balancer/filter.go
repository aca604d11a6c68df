package balancer

import "fmt"

// A ZoneFilter narrows the servers a pick considers: all of them, or those
// of one zone. It is Ribbon's ServerListFilter, evaluated on every pick from
// cached zone statistics instead of once per poll, so its decisions follow
// load and failures even when the list is pushed and never polled.
//
// Scope must be cheap (it runs on every pick), must not block, and must
// return s.Full() or a view returned by s.Zone.
type ZoneFilter interface {
	//
	// now is the balancer's clock in monotonic nanoseconds; it is 0 for
	// NoFilter and ZonePreference, which need no statistics, so their picks
	// do not read the clock.
	Scope(s *Snapshot, now int64) *View
}

// NoFilter keeps every server (Ribbon's DefaultNIWSServerListFilter).
type NoFilter struct{}

// Scope returns the full view.
func (NoFilter) Scope(s *Snapshot, _ int64) *View { return &s.full }

// ZoneAffinity keeps the servers of the client's zone (Ribbon's
// ZoneAffinityServerListFilter). With Exclusive it always does while the
// zone has a server; with Enabled only it falls back to every server when
// the zone is in trouble: tripped/count >= MaxBlackoutPercentage, load per
// server >= MaxLoadPerServer, or fewer than MinAvailableServers non-tripped
// servers.
type ZoneAffinity struct {
	Zone string
	ZoneAffinityConfig
}

// Scope implements ZoneFilter.
func (f *ZoneAffinity) Scope(s *Snapshot, now int64) *View {
	if f.Zone == "" || (!f.Enabled && !f.Exclusive) {
		return &s.full
	}
	g := s.byZone[lowerASCII(f.Zone)]
	if g == nil {
		// Ribbon would return an empty list here, failing every request
		// while the local zone is empty; pushlb fails over to all servers.
		return &s.full
	}
	if f.Exclusive {
		return &g.view
	}
	st := s.owner.zoneStats(g, now)
	if float64(st.TrippedCount)/float64(st.InstanceCount) >= f.MaxBlackoutPercentage ||
		st.LoadPerServer >= f.MaxLoadPerServer ||
		st.InstanceCount-st.TrippedCount < f.MinAvailableServers {
		return &s.full
	}
	return &g.view
}

// ZonePreference is Spring Cloud's default filter: the servers of the
// client's zone when it has any, otherwise all.
type ZonePreference struct {
	Zone string
}

// Scope implements ZoneFilter.
func (f *ZonePreference) Scope(s *Snapshot, _ int64) *View {
	if f.Zone == "" {
		return &s.full
	}
	if g := s.byZone[lowerASCII(f.Zone)]; g != nil {
		return &g.view
	}
	return &s.full
}

// NewZoneFilter builds the named filter for cfg. Names are those of the
// Filter constants or Ribbon's class names.
func NewZoneFilter(name string, cfg *Config) (ZoneFilter, error) {
	canon, err := canonicalFilter(name)
	if err != nil {
		return nil, err
	}
	zone := lowerASCII(cfg.Zone)
	switch canon {
	case FilterZoneAffinity:
		return &ZoneAffinity{Zone: zone, ZoneAffinityConfig: cfg.ZoneAffinity}, nil
	case FilterZonePreference:
		return &ZonePreference{Zone: zone}, nil
	case FilterNone:
		return NoFilter{}, nil
	}
	return nil, fmt.Errorf("%w: unknown filter %q", ErrInvalidConfig, name)
}

var (
	_ ZoneFilter = NoFilter{}
	_ ZoneFilter = (*ZoneAffinity)(nil)
	_ ZoneFilter = (*ZonePreference)(nil)
)
