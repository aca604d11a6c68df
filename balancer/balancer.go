package balancer

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Balancer balances over the servers of one service. See the package
// documentation for the model and the threading rules.
type Balancer struct {
	name   string
	cfg    *Config // never written: may be shared (newBalancer)
	rule   Rule
	filter *zoneFilter
	// loc orders the servers by region (Config.Region), nil without one.
	loc *locality
	// avoidZones turns the zone-aware choice on (Config.ZoneAware or a rule
	// that avoids zones: ZoneAvoidance).
	avoidZones bool
	rnd        Rand
	// shared is &sharedStats, the statistics' shared state, held in the
	// balancer so that a pick reads its flags one pointer from b.
	shared      *statsShared
	sharedStats statsShared
	pinger      Pinger
	source      ServerList
	// pollDelay is the polling updater's first delay (Ribbon: 1 s).
	pollDelay time.Duration

	snap atomic.Pointer[Snapshot]
	// subsets is the subset index (subset.go), built on first use.
	subsets subsets
	// zonesRefreshing lets one goroutine at a time remake the zone
	// decision; zonesAgain asks it for one more round (zone.go).
	zonesRefreshing, zonesAgain atomic.Bool
	// ruleWaits: the rule may wait (Retry), so Pick reads the clock again
	// for the request's start.
	ruleWaits bool
	// rr and za are the rule when it is this package's RoundRobin or
	// ZoneAvoidance (the default), which a pick calls directly: the pick
	// costs about what grpc-go's round_robin picker's does, and an
	// interface call with its PickInfo copied would add half of it again.
	// rrCounter is the round-robin counter of whichever it is.
	rr        *RoundRobin
	za        *ZoneAvoidance
	rrCounter *counter
	// decision is the current snapshot's zone decision, kept here by
	// syncDecision so that a pick reads it one pointer from b rather than
	// through the snapshot (see choose).
	decision atomic.Pointer[zoneDecision]
	// ejectRR walks the servers round robin for skipEjected; onPanic is
	// told of panic changes (outlier.go).
	ejectRR *counter
	onPanic PanicListener
	// slow is the slow-start state (slowstart.go), nil when off.
	slow *slowStart

	mu        sync.Mutex  // serialises list changes; guards the fields below
	byID      serverIndex // the current list by ID
	version   uint64
	listeners []Listener
	started   bool
	closed    bool
	noPolling bool // StopPolling was called: Start starts no updater
	pingLoop  *pingLoop
	updater   *pollingUpdater

	nmu      sync.Mutex // guards the notification queue
	pending  []change
	draining bool
}

// New builds a balancer for the service (client) name. It validates cfg and
// starts nothing: call Start for the ping loop and the polling updater, and
// Close when done.
func New(name string, cfg Config, opts ...Option) (*Balancer, error) {
	return newBalancer(name, &cfg, opts...)
}

// newBalancer is New with a configuration that the balancer keeps as it
// is and that others may share (a factory's balancers of its defaults
// share one): nothing writes it once the balancer holds it. Sharing saves
// a 408-byte copy a balancer, 0.4 MB at 1,000 services.
func newBalancer(name string, shared *Config, opts ...Option) (*Balancer, error) {
	cfg := *shared
	if name == "" {
		return nil, fmt.Errorf("%w: empty balancer name", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("balancer %q: %w", name, err)
	}
	b := &Balancer{
		name:      name,
		cfg:       shared,
		rnd:       globalRand{},
		pollDelay: time.Second,
		ejectRR:   newCounter(),
	}
	b.shared = &b.sharedStats
	b.shared.none.shared = b.shared
	b.shared.clock, b.shared.breaker, b.shared.activeTimeout = systemClock{}, cfg.Breaker, cfg.ActiveRequestsTimeout
	b.shared.timed, b.shared.outlier = true, cfg.OutlierDetection
	if cfg.Ping.Kind == PingHTTP {
		b.pinger = NewHTTPPing(cfg.Ping.Path, cfg.Ping.Timeout)
	}
	for _, o := range opts {
		if err := o(b); err != nil {
			return nil, fmt.Errorf("balancer %q: %w", name, err)
		}
	}
	b.shared.base = b.shared.clock.Now()
	if _, system := b.shared.clock.(systemClock); system {
		b.shared.base = processBase
	}
	var err error
	if b.rule == nil {
		if b.rule, err = NewRule(cfg.Rule, &cfg); err != nil {
			return nil, fmt.Errorf("balancer %q: %w", name, err)
		}
	}
	if b.filter, err = newZoneFilter(cfg.Filter, &cfg); err != nil {
		return nil, fmt.Errorf("balancer %q: %w", name, err)
	}
	b.avoidZones = cfg.ZoneAware || avoidsZones(b.rule)
	b.loc = newLocality(&cfg)
	if b.source == nil && len(cfg.ListOfServers) > 0 {
		servers, err := cfg.StaticServers()
		if err != nil {
			return nil, fmt.Errorf("balancer %q: %w", name, err)
		}
		b.source = StaticList(servers)
	}
	_, b.ruleWaits = b.rule.(*Retry)
	b.rr, _ = b.rule.(*RoundRobin)
	b.za, _ = b.rule.(*ZoneAvoidance)
	switch {
	case b.rr != nil:
		b.rrCounter = b.rr.c
	case b.za != nil:
		b.rrCounter = b.za.c
	}
	if cfg.OutlierDetection.Consecutive5xx > 0 {
		b.shared.ejectionAllowed = b.ejectionAllowed
	}
	b.slow = newSlowStart(b, cfg.SlowStart, b.rule)
	b.shared.zonesChanged = b.refreshZones
	b.shared.zonesDueAt = b.refreshZonesDue
	b.shared.zonesLoadChanged = b.markLoadChanged
	empty := buildSnapshot(0, nil, nil)
	empty.decision.Store(b.decideZones(empty, 0)) // not in panic: no server
	b.shared.zonesDue.Store(math.MaxInt64)
	b.snap.Store(empty)
	b.syncDecision()
	return b, nil
}

// Name returns the service (client) name.
func (b *Balancer) Name() string { return b.name }

// Config returns the balancer's configuration.
func (b *Balancer) Config() Config { return cloneConfig(*b.cfg) }

// TimesPicks reports whether the balancer times its picks' requests
// itself: true unless it was built WithoutPickTiming.
func (b *Balancer) TimesPicks() bool { return b.shared.timed }

// Snapshot returns the current immutable state.
func (b *Balancer) Snapshot() *Snapshot { return b.snap.Load() }

// AllServers returns every listed server. Do not modify the slice.
func (b *Balancer) AllServers() []*Server { return b.snap.Load().all }

// ReachableServers returns the alive servers. Do not modify the slice.
func (b *Balancer) ReachableServers() []*Server { return b.snap.Load().full.servers }

// ServerStats returns the stats of a listed server, or nil.
func (b *Balancer) ServerStats(id string) *ServerStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.byID.find(id); s != nil {
		return s.inst.own()
	}
	return nil
}

// Server returns the listed server with this ID, or nil.
func (b *Balancer) Server(id string) *Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byID.find(id)
}

// ZoneSnapshots returns fresh statistics of every zone with alive servers,
// keyed by lower-case zone name.
func (b *Balancer) ZoneSnapshots() map[string]ZoneSnapshot {
	snap := b.snap.Load()
	now := b.shared.nanotime()
	out := make(map[string]ZoneSnapshot, len(snap.zones))
	for _, g := range snap.zones {
		out[g.name] = zoneSnapshotOf(g.view.servers, now, false)
	}
	return out
}

// BreakerTrips returns how many times a server's circuit breaker tripped.
func (b *Balancer) BreakerTrips() uint64 { return b.shared.trips.Load() }
