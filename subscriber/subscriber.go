package subscriber

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// Handler receives the full live list of a service after every change.
// Calls for one service never overlap; calls for different services run
// concurrently. An error makes the subscriber deliver the service again
// after a backoff (100 ms doubling to 5 s) unless a newer change comes
// first. The ListChanged's slice must not be modified.
type Handler func(ctx context.Context, lc events.ListChanged) error

// Subscriber follows the change topics and the registry and delivers
// ListChanged to its Handler. Build it with New, run it with Start, end it
// with Close. Its methods are safe for concurrent use.
type Subscriber struct {
	nc      *nats.Conn
	reg     *serverlist.Registry
	mirror  *serverlist.Mirror
	handler Handler
	cfg     Config
	scope   scope // the services followed (scope.go)
	log     zerolog.Logger
	dropLog zerolog.Logger
	stats   counters
	guard   gossipGuard // checks gossip reports (GossipHandler)
	adv     advisories  // crash detection by client-disconnect advisories (advisory.go)
	// releaser frees the IDs of holders found gone (release.go); nil: none.
	releaser atomic.Pointer[Releaser]
	form2    sync.Map // services whose records carry their own lease, logged once

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // worker and deliveries

	mu     sync.Mutex // guards table and changes
	table  *membership
	limits limits
	// changes holds, per service, the cause of each instance's latest
	// change since the service's last delivery (events.ListChanged.Changes);
	// resynced the services whose next delivery follows the registry's load
	// (events.ListChanged.Cause), which is not recorded per instance.
	changes  map[string]map[string]events.Change
	resynced map[string]bool

	deliveries atomic.Uint64 // ListChanged revisions, one sequence for every service
	applied    sync.Map      // service -> *atomic.Pointer[Applied]
	sched      *scheduler    // when each service is delivered (scheduler.go)

	// dmu guards the fields below (but regSignal, a channel). It may be
	// held while the table's lock (mu) or the scheduler's is taken, never
	// taken while either is held.
	dmu       sync.Mutex
	stopped   bool
	started   bool
	subs      []*nats.Subscription          // every service's events, and the advisories
	svcSubs   map[string]*nats.Subscription // a scoped subscriber's, by service
	regDirty  map[string]bool
	regSignal chan struct{}
	probes    map[string]bool // lease probes in flight (leaseprobe.go)
}

// New builds a Subscriber over a NATS connection and the registry. It
// subscribes to nothing and starts no goroutine until Start.
func New(nc *nats.Conn, reg *serverlist.Registry, h Handler, cfg Config) (*Subscriber, error) {
	if nc == nil || reg == nil || h == nil {
		return nil, fmt.Errorf("%w: nil connection, registry or handler", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		nc: nc, reg: reg, handler: h, cfg: cfg,
		log:       cfg.Logger,
		dropLog:   cfg.Logger.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Second}),
		table:     newMembership(),
		changes:   make(map[string]map[string]events.Change),
		resynced:  make(map[string]bool),
		limits:    limits{unconfirmed: cfg.MaxUnconfirmed, services: cfg.MaxServices, perService: cfg.MaxInstancesPerService},
		regDirty:  make(map[string]bool),
		regSignal: make(chan struct{}, 1),
	}
	s.scope.init(cfg)
	mcfg := cfg.Mirror
	mcfg.Scoped, mcfg.Services = cfg.Scoped, cfg.Services
	mcfg.OnChange = s.registryChanged
	mcfg.OnRefresh = s.registryRefreshed
	mcfg.Logger = cfg.Logger.With().Str("component", "mirror").Logger()
	s.mirror = serverlist.NewMirror(reg, mcfg)
	s.guard.init(s.mirror, cfg.Logger)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.sched = &scheduler{
		coalesce:      cfg.Coalesce,
		ctx:           s.ctx,
		wg:            &s.wg,
		log:           s.log,
		handlerErrors: &s.stats.handlerErrors,
		send:          s.sendList,
		svcs:          make(map[string]*svcState),
	}
	return s, nil
}

// Mirror returns the registry mirror the subscriber keeps; lookups by
// instance ID should use it.
func (s *Subscriber) Mirror() *serverlist.Mirror { return s.mirror }

// Start subscribes, loads the registry's state, applies what arrived
// meanwhile and delivers every known service once; then it returns, and
// changes are delivered as they come until Close. ctx bounds the initial
// load only. Start after Close returns ErrClosed; a second Start does
// nothing. When Start fails, call Close to release what it set up.
func (s *Subscriber) Start(ctx context.Context) error {
	s.dmu.Lock()
	if s.stopped {
		s.dmu.Unlock()
		return ErrClosed
	}
	if s.started {
		s.dmu.Unlock()
		return nil
	}
	s.started = true
	s.dmu.Unlock()

	// Subscribe first: events that arrive during the load are applied to
	// the table at once, and delivered once the load is done.
	if err := s.subscribe(); err != nil {
		return err
	}
	// The subscriptions are in place once the server has them.
	if err := s.flush(ctx); err != nil {
		return fmt.Errorf("subscriber: flush: %w", err)
	}

	if err := s.mirror.Start(s.ctx); err != nil {
		return fmt.Errorf("subscriber: mirror: %w", err)
	}
	if err := s.mirror.WaitSynced(ctx); err != nil {
		return fmt.Errorf("subscriber: waiting for the registry: %w", err)
	}
	s.takeRegistryDirty() // the full reconcile below covers them
	for _, svc := range s.followedServices() {
		s.reconcile(ctx, svc, events.CauseResync)
	}

	s.dmu.Lock()
	s.mu.Lock()
	known := s.table.serviceNames()
	s.mu.Unlock()
	s.sched.start(known)
	s.wg.Add(1)
	if s.cfg.AdvisorySubject != "" {
		s.wg.Add(1)
		go s.checkAdvisories()
	}
	s.dmu.Unlock()
	go s.work()
	s.log.Info().Int("services", len(known)).Msg("subscriber started")
	return nil
}

// flushTimeout bounds a flush whose ctx has no deadline.
const flushTimeout = 10 * time.Second

// flush waits until the server has processed what the connection sent
// (subscriptions included), within ctx and at most flushTimeout when ctx
// has no deadline.
func (s *Subscriber) flush(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushTimeout)
		defer cancel()
	}
	return s.nc.FlushWithContext(ctx)
}

// Close unsubscribes, stops the mirror and the background work, and waits
// for deliveries in progress: no Handler call happens after it returns. It
// is idempotent, may be called before Start, must not be called from the
// Handler, and returns the first error met while unsubscribing.
func (s *Subscriber) Close() error {
	s.dmu.Lock()
	if s.stopped {
		s.dmu.Unlock()
		return nil
	}
	s.stopped = true
	subs := s.subs
	for _, sub := range s.svcSubs {
		subs = append(subs, sub)
	}
	s.sched.stop()
	s.dmu.Unlock()
	var errs []error
	for _, sub := range subs {
		// A closed connection or subscription has nothing left to undo.
		if err := sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
			errs = append(errs, fmt.Errorf("subscriber: unsubscribe %s: %w", sub.Subject, err))
		}
	}
	s.cancel()
	if err := s.mirror.Close(); err != nil {
		errs = append(errs, fmt.Errorf("subscriber: mirror: %w", err))
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// Stats returns the counters.
func (s *Subscriber) Stats() Stats {
	st := s.stats.snapshot()
	st.GossipIgnored = s.guard.ignored.Load()
	st.Advisories = s.adv.stats()
	if set := s.scope.set.Load(); set != nil {
		st.Followed = len(*set)
	}
	return st
}

// Live returns the live instance IDs of every known service.
func (s *Subscriber) Live() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]string, len(s.table.services))
	for _, svc := range s.table.serviceNames() {
		out[svc] = s.table.live(svc)
	}
	return out
}

// GossipGone takes an instance offline because gossip declared its node
// dead or saw it leave. Only that incarnation is affected: a late report
// about an older incarnation is ignored. The instance comes back when
// gossip sees it alive again (GossipAlive) or it restarts.
func (s *Subscriber) GossipGone(service, id string, incarnation int64) {
	s.gossip(service, id, incarnation, false)
}

// GossipAlive brings back an instance that GossipGone took offline, when
// its node turns out alive after all (it refuted the suspicion). It never
// adds an instance that has not announced itself.
func (s *Subscriber) GossipAlive(service, id string, incarnation int64) {
	s.gossip(service, id, incarnation, true)
}

func (s *Subscriber) gossip(service, id string, incarnation int64, alive bool) {
	if !s.scope.has(service) {
		return
	}
	now := time.Now()
	if err := events.CheckIncarnation(incarnation, now); err != nil {
		s.stats.drop(DropFuture)
		s.dropLog.Warn().Err(err).Str("service", service).Str("id", id).Bool("alive", alive).Msg("ignored a gossip report with an incarnation in the future")
		return
	}
	s.mu.Lock()
	if !s.table.admits(service, id, s.limits) {
		s.mu.Unlock()
		s.stats.drop(DropLimit)
		return
	}
	out := s.table.event(service, id, incarnation, alive, fromGossip, s.mirror.ServiceRevision(service), now)
	if out == applied {
		s.noteLocked(service, id, events.CauseGossip, time.Time{})
	}
	s.mu.Unlock()
	if out != applied {
		return
	}
	if alive {
		s.stats.gossipRevivals.Add(1)
	} else {
		s.stats.gossipRemovals.Add(1)
	}
	s.log.Info().Str("service", service).Str("id", id).Int64("incarnation", incarnation).Bool("alive", alive).Msg("gossip changed an instance")
	s.markDirty(service)
}

// onMsg runs on the NATS delivery goroutine: it must be quick and never
// wait on a handler.
func (s *Subscriber) onMsg(msg *nats.Msg) {
	// Counted once handled, so that Received proves processing.
	defer s.stats.received.Add(1)
	ev, err := events.DecodeMessage(s.cfg.Prefix, msg.Subject, msg.Data)
	if err != nil {
		reason := dropReason(err)
		s.stats.drop(reason)
		s.dropLog.Warn().Err(err).Str("subject", truncate(msg.Subject, 200)).Int("bytes", len(msg.Data)).
			Stringer("reason", reason).Msg("dropped event")
		return
	}
	// Before any state: another region's instance is not this region's
	// instance of the same ID. A busy other region sends many, all
	// expected: debug, not warn.
	if s.otherRegion(ev.Region) {
		s.stats.drop(DropOtherRegion)
		s.dropLog.Debug().Str("service", ev.Service).Str("id", truncate(ev.InstanceID, 200)).Stringer("kind", ev.Kind).
			Str("region", truncate(ev.Region, 200)).Msg("dropped event of another region")
		return
	}
	if !s.scope.has(ev.Service) {
		s.stats.drop(DropUnsubscribed)
		return
	}
	now := time.Now()
	if err := events.CheckIncarnation(ev.Incarnation, now); err != nil {
		s.stats.drop(DropFuture)
		s.dropLog.Warn().Err(err).Str("service", ev.Service).Str("id", truncate(ev.InstanceID, 200)).
			Stringer("kind", ev.Kind).Msg("dropped event with an incarnation in the future")
		return
	}
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
	s.mu.Lock()
	if !s.table.admits(ev.Service, ev.InstanceID, s.limits) {
		s.mu.Unlock()
		s.stats.drop(DropLimit)
		s.dropLog.Warn().Str("service", ev.Service).Str("id", truncate(ev.InstanceID, 200)).Stringer("kind", ev.Kind).
			Msg("dropped event: a new instance beyond the limits (unconfirmed instances, services, instances per service)")
		return
	}
	// The mirror's revision of the service now: a registry write of it
	// after this is newer than the event, and may undo an offline it
	// records.
	out := s.table.event(ev.Service, ev.InstanceID, ev.Incarnation, ev.Kind == events.Online, fromEvent, s.mirror.ServiceRevision(ev.Service), now)
	if out == applied {
		cause := events.CauseAnnounce
		if ev.Kind == events.Offline {
			cause = events.CauseOffline
		}
		s.noteLocked(ev.Service, ev.InstanceID, cause, ev.At)
	}
	s.mu.Unlock()
	switch out {
	case applied:
		s.stats.applied.Add(1)
		s.markDirty(ev.Service)
		if ev.Kind == events.Offline {
			s.stats.offlineRemovals.Add(1)
			if _, ok := s.mirror.Entry(ev.Service, ev.InstanceID); ok {
				s.probeLease(ev.Service, ev.InstanceID)
			}
		}
	case stale:
		s.stats.drop(DropStale)
		s.dropLog.Debug().Str("service", ev.Service).Str("id", ev.InstanceID).Int64("incarnation", ev.Incarnation).
			Stringer("kind", ev.Kind).Msg("dropped stale event")
	case duplicate:
		s.stats.drop(DropDuplicate)
	}
}

// otherRegion reports whether an event of region belongs to another region
// than the subscriber's (Config.Region): both set, and different without
// regard to case, as regions are compared elsewhere (balancers, DNS).
func (s *Subscriber) otherRegion(region string) bool {
	return s.cfg.Region != "" && region != "" && !strings.EqualFold(s.cfg.Region, region)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// registryRefreshed is the mirror's OnRefresh: a put that left an
// instance's value unchanged (a lease refresh) at a new revision. It costs a
// map lookup, and a rebuild only when the write brings back an instance an
// event or gossip took offline before it: the registry's order wins over
// any incarnation an offline claimed.
func (s *Subscriber) registryRefreshed(service, id string, incarnation int64, revision uint64) {
	if !s.scope.has(service) {
		return
	}
	if _, seen := s.form2.LoadOrStore(service, struct{}{}); !seen {
		// Once per service: the records of a registry are the deployment's
		// (access-controlled), so their services are bounded.
		s.log.Warn().Str("service", service).Str("id", id).
			Msg("records of this service carry their own lease (form 2): every renewal of every instance reaches every gateway, a cost that grows with the fleet; announce with form 1 (the announce binary, the publisher API, or docs/protocol.md section 5) so that only the reaper receives renewals")
	}
	s.mu.Lock()
	out := s.table.registered(service, id, incarnation, revision, time.Now())
	if out == applied {
		s.noteLocked(service, id, events.CauseRegistry, time.Time{})
	}
	s.mu.Unlock()
	if out != applied {
		return
	}
	s.stats.registryRevivals.Add(1)
	s.log.Warn().Str("service", service).Str("id", id).Int64("incarnation", incarnation).Uint64("revision", revision).
		Msg("a registry write after an offline brought the instance back (the offline was forged, or the instance re-asserted itself)")
	s.markDirty(service)
}

// registryChanged is the mirror's OnChange: it queues the service for
// reconciliation by the worker, without blocking the mirror.
func (s *Subscriber) registryChanged(service string) {
	if !s.scope.has(service) {
		return
	}
	s.dmu.Lock()
	s.regDirty[service] = true
	s.dmu.Unlock()
	select {
	case s.regSignal <- struct{}{}:
	default:
	}
}

func (s *Subscriber) takeRegistryDirty() []string {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	out := make([]string, 0, len(s.regDirty))
	for svc := range s.regDirty {
		out = append(out, svc)
	}
	clear(s.regDirty)
	slices.Sort(out)
	return out
}

// followedServices are the services to reconcile: those the table or the
// mirror knows, limited to the followed ones.
func (s *Subscriber) followedServices() []string {
	s.mu.Lock()
	names := s.table.serviceNames()
	s.mu.Unlock()
	names = append(names, s.mirror.Services()...)
	slices.Sort(names)
	names = slices.Compact(names)
	return slices.DeleteFunc(names, func(n string) bool { return !s.scope.has(n) })
}

// work reconciles services the registry changed, runs anti-entropy and
// collects old tombstones.
func (s *Subscriber) work() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.AntiEntropy)
	defer t.Stop()
	confirm := time.NewTicker(max(s.cfg.ConfirmWithin/4, 10*time.Millisecond))
	defer confirm.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case now := <-confirm.C:
			s.expireUnconfirmed(now)
		case <-s.regSignal:
			for _, svc := range s.takeRegistryDirty() {
				s.reconcile(s.ctx, svc, events.CauseRegistry)
				// The registry's data for the service changed (an address,
				// a zone, a new incarnation): rebuild even if the live set
				// did not.
				s.markDirty(svc)
			}
			s.recheckUnmatched()
		case <-t.C:
			for _, svc := range s.followedServices() {
				if s.reconcile(s.ctx, svc, events.CauseRegistry) {
					s.markDirty(svc)
				}
			}
			s.mu.Lock()
			s.table.collect(time.Now().Add(-s.cfg.TombstoneTTL))
			s.mu.Unlock()
		}
	}
}

// expireUnconfirmed forgets the instances known only from events that the
// registry has not shown within ConfirmWithin. While the mirror is not
// synced (NATS away, a resync), nothing is forgotten: the registry cannot
// be seen.
func (s *Subscriber) expireUnconfirmed(now time.Time) {
	if !s.mirror.Synced() || !s.nc.IsConnected() {
		return
	}
	s.mu.Lock()
	changed, dropped := s.table.expire(now.Add(-s.cfg.ConfirmWithin))
	if dropped > 0 {
		s.pruneChangesLocked()
	}
	s.mu.Unlock()
	if dropped == 0 {
		return
	}
	s.stats.unconfirmed.Add(uint64(dropped))
	s.dropLog.Warn().Int("instances", dropped).Strs("services", changed[:min(len(changed), 10)]).Int("live_services", len(changed)).
		Msg("forgot instances that events announced but the registry never held")
	for _, svc := range changed {
		s.markDirty(svc)
	}
}

// reconcile makes the table agree with the registry for one service and
// reports whether the live set changed; cause is recorded for the
// instances it changes. Live instances the mirror lacks are
// taken offline only once a direct read confirms they are gone: the mirror
// may lag an online event by a moment.
func (s *Subscriber) reconcile(ctx context.Context, service string, cause events.Cause) bool {
	s.stats.reconciles.Add(1)
	var truth []regEntry // sorted by ID, as the mirror yields them
	for id, v := range s.mirror.Versions(service) {
		truth = append(truth, regEntry{id: id, inc: v.Incarnation, rev: v.Revision})
	}
	byID := func(a, b regEntry) int { return strings.Compare(a.id, b.id) }
	if !slices.IsSortedFunc(truth, byID) {
		slices.SortFunc(truth, byID)
	}
	now := time.Now()
	s.mu.Lock()
	changed := false
	s.table.reserve(service, len(truth))
	for _, e := range truth {
		mem, known := s.table.get(service, e.id)
		wasOff := known && !mem.live()
		if s.table.registered(service, e.id, e.inc, e.rev, now) == applied {
			changed = true
			s.noteLocked(service, e.id, cause, time.Time{})
			if wasOff {
				s.stats.registryRevivals.Add(1)
			}
		}
	}
	absent := s.table.liveAbsent(service, truth)
	s.mu.Unlock()
	for _, id := range absent {
		asOf := s.mirror.ServiceRevision(service)
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RegistryTimeout)
		in, err := s.reg.Get(rctx, service, id)
		cancel()
		switch {
		case errors.Is(err, serverlist.ErrNotFound):
			s.mu.Lock()
			out := s.table.unregistered(service, id, asOf, time.Now())
			if out == applied {
				s.noteLocked(service, id, cause, time.Time{})
			}
			s.mu.Unlock()
			if out == applied {
				changed = true
				s.stats.registryRemovals.Add(1)
				s.log.Info().Str("service", service).Str("id", id).Msg("instance gone from the registry (deregistered or lease expired)")
			}
		case err != nil:
			// The registry is unreachable: keep the instance; the next
			// reconciliation decides.
			s.log.Warn().Err(err).Str("service", service).Str("id", id).Msg("registry read failed; instance kept")
		default:
			// The mirror lags the registry: the instance is there. Its
			// revision comes with the mirror's put, soon.
			s.mu.Lock()
			if s.table.registered(service, id, in.Incarnation, 0, time.Now()) == applied {
				changed = true
				s.noteLocked(service, id, cause, time.Time{})
			}
			s.mu.Unlock()
		}
	}
	return changed
}

// Reoffer delivers the service's list again as soon as the coalescing
// window allows, instead of after the backoff of a list the Handler
// deferred (ErrDeferred) or failed: for a handler that learns that what
// made it defer the list no longer holds. It does nothing for a service
// whose delivery is not waiting for a backoff. Safe from any goroutine.
func (s *Subscriber) Reoffer(service string) { s.sched.reoffer(service) }

// markDirty records a change of service and schedules its delivery. A
// service the registry never showed an instance of, and whose lists were
// never delivered, has nothing to deliver yet: its events are hints that
// the registry confirms (then the mirror's change marks it again) or that
// are forgotten. So a flood of announcements for invented services costs
// no delivery.
func (s *Subscriber) markDirty(service string) {
	s.mu.Lock()
	confirmed := s.table.hasConfirmed(service)
	s.mu.Unlock()
	s.sched.mark(service, confirmed)
}

// sendList calls the handler with the service's current live list and
// reports whether the table still knows the service. The scheduler runs
// it, never for one service twice at a time.
func (s *Subscriber) sendList(service string) (known bool, err error) {
	// Read before the table: the list sent reflects at least this much of
	// the registry.
	rev := s.mirror.ServiceRevision(service)
	s.mu.Lock()
	ids := s.table.live(service)
	digest := s.table.digest(service, ids)
	_, known = s.table.services[service]
	changes := s.changes[service]
	delete(s.changes, service)
	var cause events.Cause
	if s.resynced[service] {
		cause = events.CauseResync
		delete(s.resynced, service)
	}
	s.mu.Unlock()
	// One sequence for every service, so that a service whose delivery
	// state was dropped (scheduler.deliver) and comes back still gets
	// growing revisions.
	err = s.handler(s.ctx, events.ListChanged{Service: service, InstanceIDs: ids, Revision: s.deliveries.Add(1), Changes: changes, Cause: cause})
	s.stats.delivered.Add(1)
	if err == nil {
		s.noteApplied(service, rev, digest, known)
	}
	if err != nil && (len(changes) > 0 || cause != "") {
		// Retried: the causes go out with the retry, unless newer ones
		// were recorded meanwhile.
		s.mu.Lock()
		for id, c := range changes {
			if _, newer := s.changes[service][id]; !newer {
				s.noteLocked(service, id, c.Cause, c.EventAt)
			}
		}
		if cause != "" {
			s.resynced[service] = true
		}
		s.mu.Unlock()
	}
	return known, err
}

// noteApplied records that the Handler took a list of service, of digest,
// that reflects the registry up to rev (Applied); a service the table
// forgot is forgotten here too.
func (s *Subscriber) noteApplied(service string, rev uint64, digest string, known bool) {
	if !known {
		s.applied.Delete(service)
		return
	}
	v, ok := s.applied.Load(service)
	if !ok {
		v, _ = s.applied.LoadOrStore(service, new(atomic.Pointer[Applied]))
	}
	p := v.(*atomic.Pointer[Applied])
	next := Applied{Revision: rev, Digest: digest, At: time.Now()}
	if cur := p.Load(); cur != nil {
		// The same list again (the registry's revision moved on without
		// changing it): applied when it was first.
		next.Revision = max(cur.Revision, rev)
		if cur.Digest == digest {
			next.At = cur.At
		}
	}
	// One goroutine delivers a service at a time: no race between the
	// load and the store.
	p.Store(&next)
}

// Applied is the registry revision of a service that the Handler has
// applied, and when.
type Applied struct {
	// Revision is the registry revision the service's last list handled
	// without error reflected: every registry write of the service up to
	// it (see serverlist.Mirror.ServiceRevision). A change written at
	// revision r has reached the Handler once this is r or more.
	Revision uint64 `json:"revision"`
	// Digest sums the list: its instance IDs and their incarnations
	// (16 hex digits). Two clients whose lists have the same digest hold
	// the same instances, whatever their revisions: a lease refresh moves
	// the revision of a service, not its list.
	Digest string `json:"digest"`
	// At is when the Handler took a list of this digest.
	At time.Time `json:"at"`
}

// Applied returns what the Handler has applied of service: the
// convergence of one client, which a fleet view compares across clients.
// The zero Applied for a service not delivered yet.
func (s *Subscriber) Applied(service string) Applied {
	if v, ok := s.applied.Load(service); ok {
		if a := v.(*atomic.Pointer[Applied]).Load(); a != nil {
			return *a
		}
	}
	return Applied{}
}

// AppliedAll calls f with what the Handler has applied of each service
// delivered, in no particular order.
func (s *Subscriber) AppliedAll(f func(service string, a Applied)) {
	s.applied.Range(func(k, v any) bool {
		if a := v.(*atomic.Pointer[Applied]).Load(); a != nil {
			f(k.(string), *a)
		}
		return true
	})
}

// pruneChangesLocked forgets the causes of instances the table forgot, so
// that a flood of announcements for services or instances nobody
// registered, which are never delivered, leaves nothing behind. Called with
// mu held.
func (s *Subscriber) pruneChangesLocked() {
	for svc, m := range s.changes {
		for id := range m {
			if _, ok := s.table.get(svc, id); !ok {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(s.changes, svc)
		}
	}
	for svc := range s.resynced {
		if s.table.services[svc] == nil {
			delete(s.resynced, svc)
		}
	}
}

// noteLocked records why an instance of service changed, for the service's
// next delivery. A resync changes every instance of the service at once: it
// is recorded for the service, not per instance (a map entry per instance
// of the fleet at start). Called with mu held.
func (s *Subscriber) noteLocked(service, id string, cause events.Cause, eventAt time.Time) {
	if cause == events.CauseResync {
		s.resynced[service] = true
		return
	}
	m := s.changes[service]
	if m == nil {
		m = make(map[string]events.Change)
		s.changes[service] = m
	}
	m[id] = events.Change{Cause: cause, EventAt: eventAt}
}
