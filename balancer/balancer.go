package balancer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Listener is told about every change of a balancer's list: the list before
// and after, in list order. The first call after AddListener carries an
// empty old list and the current servers. Listeners are called one at a
// time, in the order of the changes, never under the balancer's lock; they
// may call back into the balancer. The slices must not be modified.
type Listener func(old, new []*Server)

// Rand is the randomness a balancer uses. The default is math/rand/v2's
// global source; tests inject a seeded one. Implementations must be safe
// for concurrent use.
type Rand interface {
	IntN(n int) int
	Float64() float64
}

type globalRand struct{}

func (globalRand) IntN(n int) int { return rand.IntN(n) }

// intN returns r.IntN(n), n > 0. With the default randomness (no
// WithRand) the number comes straight from the runtime's per-thread
// generator, scaled by a multiplication: no interface call and no
// rejection loop, which cost as much as a whole round-robin pick. Its
// bias, n / 2^64, is nil in practice.
func intN(r Rand, n int) int {
	if _, global := r.(globalRand); global {
		hi, _ := bits.Mul64(rand.Uint64(), uint64(n))
		return int(hi)
	}
	return r.IntN(n)
}
func (globalRand) Float64() float64 { return rand.Float64() }

// Option customises a Balancer.
type Option func(*Balancer) error

// WithClock sets the clock used by stats, breakers and caches.
func WithClock(c Clock) Option {
	return func(b *Balancer) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidConfig)
		}
		b.shared.clock = c
		return nil
	}
}

// WithRand sets the source of randomness.
func WithRand(r Rand) Option {
	return func(b *Balancer) error {
		if r == nil {
			return fmt.Errorf("%w: nil rand", ErrInvalidConfig)
		}
		b.rnd = r
		return nil
	}
}

// WithRule sets a rule instance, overriding Config.Rule: a rule of this
// package built with its own settings, or a custom one written anywhere
// (see Rule for what it receives and its threading rules).
func WithRule(r Rule) Option {
	return func(b *Balancer) error {
		if r == nil {
			return fmt.Errorf("%w: nil rule", ErrInvalidConfig)
		}
		b.rule = r
		return nil
	}
}

// WithPinger sets the liveness check, overriding Config.Ping.Kind. A nil
// Pinger or NoOpPing means no ping loop.
func WithPinger(p Pinger) Option {
	return func(b *Balancer) error {
		b.pinger = p
		return nil
	}
}

// WithoutPickTiming makes the balancer leave the timing of requests to its
// caller: a Pick reports the response time it measured itself
// (DoneInfo.ResponseTime, or Responded's argument), and one reported as
// zero records none. The pick and its end then read no system clock,
// which costs about 50 ns on a virtual machine, twice a request, more
// than the pick itself: the statistics that need no better than a
// millisecond (active-request decay, zone decisions, breakers) read the
// coarse clock of a started balancer instead. Use it when every outcome
// carries its response time, or when response times are not wanted (no
// rule that reads them: WeightedResponseTime, or a rule of your own).
func WithoutPickTiming() Option {
	return func(b *Balancer) error {
		b.shared.timed = false
		return nil
	}
}

// WithServerList sets the source a polling updater reads the list from.
// Without it, a balancer whose config has ListOfServers uses that static
// list; otherwise it has no updater and is fed by SetServers (the push path).
func WithServerList(l ServerList) Option {
	return func(b *Balancer) error {
		b.source = l
		return nil
	}
}

// Balancer balances over the servers of one service. See the package
// documentation for the model and the threading rules.
type Balancer struct {
	name   string
	cfg    Config
	rule   Rule
	filter *zoneFilter
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

type change struct {
	old, new []*Server
	only     Listener // nil: every listener
}

// New builds a balancer for the service (client) name. It validates cfg and
// starts nothing: call Start for the ping loop and the polling updater, and
// Close when done.
func New(name string, cfg Config, opts ...Option) (*Balancer, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty balancer name", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("balancer %q: %w", name, err)
	}
	b := &Balancer{
		name:      name,
		cfg:       cfg,
		rnd:       globalRand{},
		pollDelay: time.Second,
		ejectRR:   newCounter(),
	}
	b.shared = &b.sharedStats
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
func (b *Balancer) Config() Config { return b.cfg }

// TimesPicks reports whether the balancer times its picks' requests
// itself: true unless it was built WithoutPickTiming.
func (b *Balancer) TimesPicks() bool { return b.shared.timed }

// Snapshot returns the current immutable state.
func (b *Balancer) Snapshot() *Snapshot { return b.snap.Load() }

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
	return Pick{Server: srv, start: srv.inst.stats.requestStartedAt(now)}, nil
}

// Begin starts a request to s, a server of this balancer the caller chose
// itself (with Choose, or from ReachableServers: a same-server retry, a
// fail-over outside the rule), and returns its Pick. A server that did
// not come from a balancer gets a Pick that records nothing.
func (b *Balancer) Begin(s *Server) Pick {
	if s == nil || s.inst == nil {
		return Pick{Server: s}
	}
	return Pick{Server: s, start: s.inst.stats.requestStarted()}
}

// SetServers replaces the list. Servers are identified by ID (host:port
// when empty); the first of duplicate IDs wins. Invalid entries are left out
// and reported in the returned error; if every entry of a non-empty list is
// invalid, the current list is kept. An equal list changes nothing. Stats
// of servers that stay are kept; servers new to the list start alive.
func (b *Balancer) SetServers(servers []Server) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	list, byID, err := b.adopt(servers)
	if len(list) == 0 && len(servers) > 0 {
		b.mu.Unlock()
		return fmt.Errorf("balancer %q: no valid server, list kept: %w", b.name, err)
	}
	b.installLocked(list, byID)
	b.mu.Unlock()
	b.notify()
	return err
}

// AddServers adds servers to the list; a server with an ID already listed
// replaces it in place.
func (b *Balancer) AddServers(servers ...Server) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	cur := b.snap.Load().all
	merged := make([]Server, 0, len(cur)+len(servers))
	for _, s := range cur {
		merged = append(merged, *s)
	}
	merged = append(merged, servers...)
	// Later entries replace earlier ones with the same ID, in place.
	list, byID, err := b.adopt(dedupeLastWins(merged))
	b.installLocked(list, byID)
	b.mu.Unlock()
	b.notify()
	return err
}

func dedupeLastWins(in []Server) []Server {
	key := func(s *Server) string {
		if s.ID == "" && s.Host != "" {
			return s.Addr() // the ID SetServers will give it
		}
		return s.ID
	}
	last := make(map[string]int, len(in))
	for i := range in {
		last[key(&in[i])] = i
	}
	out := make([]Server, 0, len(last))
	for i := range in {
		k := key(&in[i])
		if j, ok := last[k]; ok {
			out = append(out, in[j]) // at the first position, with the last value
			delete(last, k)
		}
	}
	return out
}

// adopt turns caller values into the balancer's *Server copies, reusing the
// current copy of an unchanged server, and indexes them by ID. Called with
// b.mu held.
func (b *Balancer) adopt(servers []Server) ([]*Server, serverIndex, error) {
	var errs []indexedError
	var metadata metadataCopies
	list := make([]*Server, 0, len(servers))
	from := make([]int, 0, len(servers)) // list[i] is servers[from[i]]
	prev := b.snap.Load().all
	for i := range servers {
		s := servers[i]
		// A copy of one of our servers carries derived fields: drop them,
		// the caller may have changed what they derive from.
		s.inst, s.zone, s.addr = nil, zoneName{}, ""
		if err := s.normalize(); err != nil {
			errs = append(errs, indexedError{i, err})
			continue
		}
		// A list mostly comes in the order of the one before: the server
		// at the same position is the likely one, then a search.
		var old *Server
		if j := len(list); j < len(prev) && prev[j].ID == s.ID {
			old = prev[j]
		} else {
			old = b.byID.find(s.ID)
		}
		if old != nil && old.sameAs(&s) {
			list = append(list, old)
			from = append(from, i)
			continue
		}
		// A fresh copy only for new or changed servers: taking &s would
		// move every loop's s to the heap.
		ns := new(Server)
		*ns = s
		ns.Metadata = metadata.copyOf(s.Metadata)
		ns.zone = zoneNameOf(s.Zone)
		ns.addr = ns.Addr()
		if old != nil {
			ns.inst = old.inst // same instance, new details: keep its stats
		} else {
			ns.inst = &instance{stats: ServerStats{shared: b.shared}}
			ns.inst.alive.Store(true)
		}
		list = append(list, ns)
		from = append(from, i)
	}
	list, byID, dups := indexByID(list, from)
	errs = append(errs, dups...)
	return list, byID, joinInOrder(errs)
}

// serverIndex is a list of servers sorted by ID, searched by binary
// search: 8 bytes a server, where a map by ID took about 33 (docs/perf.md,
// "Cold start, third pass").
type serverIndex []*Server

func compareID(s *Server, id string) int { return strings.Compare(s.ID, id) }

// find returns the server with this ID, or nil.
func (x serverIndex) find(id string) *Server {
	if i, ok := slices.BinarySearchFunc(x, id, compareID); ok {
		return x[i]
	}
	return nil
}

// indexByID indexes list by ID, from[i] being the position in the
// caller's list of list[i]. Of servers with one ID the first is kept:
// it returns the list without the others, the index, and an error for
// each server left out, at its position in the caller's list.
func indexByID(list []*Server, from []int) ([]*Server, serverIndex, []indexedError) {
	byID := func(a, b *Server) int { return strings.Compare(a.ID, b.ID) }
	// A list in ID order (a registry's, as lbvisitor gives it) is its own
	// index, 8 bytes a server less: neither is ever written once built.
	index := list
	if !slices.IsSortedFunc(list, byID) {
		index = slices.Clone(list)
		// Stable: of equal IDs, the first of the list comes first.
		slices.SortStableFunc(index, byID)
	}
	dup := false
	for i := 1; i < len(index); i++ {
		if index[i].ID == index[i-1].ID {
			dup = true
			break
		}
	}
	if !dup {
		return list, index, nil
	}
	// Duplicates are rare: find them again by position, as the same
	// *Server may stand at two positions.
	var errs []indexedError
	seen := make(map[string]bool, len(list))
	kept := list[:0:0]
	for i, s := range list {
		if seen[s.ID] {
			errs = append(errs, indexedError{from[i], fmt.Errorf("balancer: server %q: duplicate ID, first kept", s.ID)})
			continue
		}
		seen[s.ID] = true
		kept = append(kept, s)
	}
	if sameArray(index, list) {
		index = slices.Clone(index) // compacted below: the caller's list stays as it is
	}
	return kept, slices.CompactFunc(index, func(a, b *Server) bool { return a.ID == b.ID }), errs
}

// indexedError is an error about the server at position at of a list.
type indexedError struct {
	at  int
	err error
}

// joinInOrder joins errs in the order of their positions.
func joinInOrder(errs []indexedError) error {
	if len(errs) == 0 {
		return nil
	}
	slices.SortStableFunc(errs, func(a, b indexedError) int { return a.at - b.at })
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e.err
	}
	return errors.Join(out...)
}

// metadataCopies makes the balancer's copies of its servers' metadata,
// one copy shared by the servers whose metadata are equal: the instances
// of a service mostly carry the same labels (a version, a team), and a
// copy per server was the largest part of a balancer's memory at 100,000
// servers (docs/perf.md, "Cold start"). The copies are never modified.
// It remembers the last few distinct maps it copied, which catches runs
// of equal maps in a list; the zero value is ready to use.
type metadataCopies struct {
	recent [4]map[string]string
	next   int
}

func (c *metadataCopies) copyOf(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	for _, r := range c.recent {
		if r != nil && maps.Equal(r, m) {
			return r
		}
	}
	out := maps.Clone(m)
	c.recent[c.next] = out
	c.next = (c.next + 1) % len(c.recent)
	return out
}

// installLocked swaps in a snapshot of list if it differs from the current
// one and queues the change for listeners. Called with b.mu held.
func (b *Balancer) installLocked(list []*Server, byID serverIndex) {
	old := b.snap.Load()
	if slices.Equal(old.all, list) {
		return
	}
	b.byID = byID
	if b.slow != nil {
		b.slow.noteList(old.all, list, b.shared.nanotime())
	}
	b.swapLocked(list)
	b.nmu.Lock()
	b.pending = append(b.pending, change{old: old.all, new: list})
	b.nmu.Unlock()
	if b.pingLoop != nil {
		b.pingLoop.kick()
	}
}

// swapLocked installs a new snapshot of list. Called with b.mu held.
func (b *Balancer) swapLocked(list []*Server) {
	b.version++
	snap := buildSnapshot(b.version, list, b.slow.rampAt(list, b.shared))
	prepareRule(b, b.rule, snap) // BestAvailable's and Maglev's indexes (rules.go)
	// The zone decision is made with the snapshot (zone.go). A breaker
	// change while it was made, or a refresh of the old snapshot's, is
	// redone over the new one.
	epoch := b.shared.epoch.Load()
	b.shared.zonesPending.Store(false)
	d := b.decideZones(snap, b.shared.nanotime())
	snap.decision.Store(d)
	old := b.snap.Swap(snap)
	b.syncDecision()
	b.recheckIfLoadChanged()
	b.notePanic(d)
	close(old.replaced)
	if b.zonesRefreshing.Load() || b.shared.epoch.Load() != epoch {
		b.refreshZones()
	} else {
		b.shared.zonesDue.Store(d.due)
	}
}

// syncDecision sets b.decision to the current snapshot's decision. Every
// writer of either calls it after its write, and it returns only once it
// saw them agree, so the last writer leaves them agreeing. A writer that
// read an older state fails its swap: every decision is a new object, so
// the value it read before that state cannot be the current one again.
// Between a write and its sync, a pick may use the decision before it, as
// a pick that loaded the snapshot just before the write does.
func (b *Balancer) syncDecision() {
	for {
		cur := b.decision.Load()
		want := b.snap.Load().decision.Load()
		if cur == want {
			return
		}
		b.decision.CompareAndSwap(cur, want)
	}
}

// markLoadChanged tells the balancer's current decision that an active
// count changed after it was made (statsShared.loadChanged, once
// zonesPending is set), so that a Choose reads the clock to see whether
// it is due.
func (b *Balancer) markLoadChanged() {
	if d := b.decision.Load(); d != nil { // nil only while New runs
		d.recheck.Or(recheckLoad)
	}
}

// recheckIfLoadChanged is called after a new decision is installed: if an
// active count changed since zonesPending was cleared for it, the count's
// markLoadChanged may have marked the decision before (its load of
// b.decision came first), so the current one is marked here. zonesPending
// is set before its decision is marked, and cleared before a decision is
// made: either this load sees it set, or the mark comes after the new
// decision is installed and lands on it.
func (b *Balancer) recheckIfLoadChanged() {
	if b.shared.zonesPending.Load() {
		b.markLoadChanged()
	}
}

// MarkServerDown takes a server out of the reachable list until it is
// marked up, a ping finds it alive, or it leaves the list and comes back.
// It reports whether the server is listed.
func (b *Balancer) MarkServerDown(id string) bool { return b.setAlive(map[string]bool{id: false}) }

// MarkServerUp returns a server marked down to the reachable list. It
// reports whether the server is listed.
func (b *Balancer) MarkServerUp(id string) bool { return b.setAlive(map[string]bool{id: true}) }

// MarkServers marks several servers up (true) or down (false) at once,
// with one new snapshot: for an adapter that follows connection states
// (the gRPC balancer marks down the endpoints that are not READY). It
// reports whether any of the IDs is listed; unknown IDs are ignored.
func (b *Balancer) MarkServers(alive map[string]bool) bool { return b.setAlive(alive) }

// setAlive applies liveness results and rebuilds the snapshot if any
// changed. It reports whether any of the IDs is listed.
func (b *Balancer) setAlive(alive map[string]bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	found, changed := false, false
	for id, up := range alive {
		srv := b.byID.find(id)
		if srv == nil {
			continue
		}
		inst := srv.inst
		found = true
		if inst.alive.Swap(up) != up {
			changed = true
		}
	}
	if changed {
		b.swapLocked(b.snap.Load().all)
	}
	return found
}

// AllServers returns every listed server. Do not modify the slice.
func (b *Balancer) AllServers() []*Server { return b.snap.Load().all }

// ReachableServers returns the alive servers. Do not modify the slice.
func (b *Balancer) ReachableServers() []*Server { return b.snap.Load().full.servers }

// ServerStats returns the stats of a listed server, or nil.
func (b *Balancer) ServerStats(id string) *ServerStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.byID.find(id); s != nil {
		return &s.inst.stats
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

// AddListener registers l and calls it at once with the current list.
func (b *Balancer) AddListener(l Listener) {
	b.mu.Lock()
	b.listeners = append(b.listeners, l)
	cur := b.snap.Load().all
	b.nmu.Lock()
	b.pending = append(b.pending, change{new: cur, only: l})
	b.nmu.Unlock()
	b.mu.Unlock()
	b.notify()
}

// notify drains the change queue unless another goroutine is already
// draining it; listeners run without any lock held.
func (b *Balancer) notify() {
	b.nmu.Lock()
	if b.draining {
		b.nmu.Unlock()
		return
	}
	b.draining = true
	for len(b.pending) > 0 {
		c := b.pending[0]
		b.pending = b.pending[1:]
		b.nmu.Unlock()
		if c.only != nil {
			c.only(c.old, c.new)
		} else {
			b.mu.Lock()
			ls := slices.Clone(b.listeners)
			b.mu.Unlock()
			for _, l := range ls {
				l(c.old, c.new)
			}
		}
		b.nmu.Lock()
	}
	b.draining = false
	b.nmu.Unlock()
}

// Start starts the background work the configuration asks for: the ping
// loop when a real Pinger is set, and the polling updater when a
// ServerList is set (or ListOfServers configured); New starts nothing. ctx
// bounds the start only: Start does not wait for a ping or a poll, and the
// work runs until Close whatever becomes of ctx, but the values of ctx
// reach the Pinger and ServerList calls. Calling it again is a no-op;
// after Close it returns ErrClosed.
func (b *Balancer) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if b.started {
		return nil
	}
	b.started = true
	if _, system := b.shared.clock.(systemClock); system {
		coarse.acquire()
		b.shared.coarse.Store(true)
	}
	base := context.WithoutCancel(ctx)
	if b.pinger != nil && !isNoOpPing(b.pinger) {
		b.pingLoop = startPingLoop(base, b, b.pinger, b.cfg.Ping.Interval)
	}
	if b.source != nil && !b.noPolling {
		b.updater = newPollingUpdater(b, b.source, b.pollDelay, b.cfg.ServerListRefreshInterval)
		b.updater.start(base)
	}
	return nil
}

// Polling reports whether the polling updater runs: the balancer has a
// ServerList, was started, and neither StopPolling nor Close was called.
func (b *Balancer) Polling() bool {
	b.mu.Lock()
	u := b.updater
	b.mu.Unlock()
	return u != nil && u.running()
}

// StopPolling stops the polling updater for good, and waits for a poll in
// progress: the push path calls it when it takes over the balancer's list,
// so that polls no longer overwrite pushed lists. Called before Start, it
// keeps Start from polling. It is safe to call at any time, any number of
// times.
func (b *Balancer) StopPolling() {
	b.mu.Lock()
	b.noPolling = true
	u := b.updater
	b.mu.Unlock()
	if u != nil {
		u.stop()
	}
}

// Close stops the ping loop, the polling updater and the slow-start
// refresher, and waits for them.
// Choose and Pick keep answering from the last list, and Picks already
// made may still be reported. Close is idempotent.
func (b *Balancer) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	pl, up := b.pingLoop, b.updater
	if b.shared.coarse.Swap(false) {
		coarse.release()
	}
	b.mu.Unlock()
	if pl != nil {
		pl.stop()
	}
	if up != nil {
		up.stop()
	}
	b.slow.close()
	return nil
}
