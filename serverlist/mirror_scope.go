package serverlist

// A scoped mirror (MirrorConfig.Scoped) holds the records of the services
// it is told to follow, each by a KV watch of its own keys
// ("<service>.*"), so that a client pays, and the NATS server sends, for
// the services it routes only. The watches' entries are forwarded to the
// mirror's goroutine, which applies them as it applies the single watch
// of a follow-all mirror: one goroutine owns the index either way.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
)

// scopedBuffer is the capacity of the channel that carries a scoped
// mirror's entries to its goroutine.
const scopedBuffer = 256

// scopeWant is one Follow of a service: it lives from Follow to Unfollow.
// A service unfollowed and followed again has a new one, so that the
// mirror's goroutine restarts its watch.
type scopeWant struct {
	synced   chan struct{} // closed at the first catch-up of its watch
	syncOnce sync.Once
	rev      atomic.Uint64 // the revision of the last entry of its watch applied
}

func (w *scopeWant) markSynced() { w.syncOnce.Do(func() { close(w.synced) }) }

// scopeWatch is one running KV watch of a mirror session: every record
// (service "", the follow-all mirror) or one service's. Only the mirror's
// goroutine touches it, but for the forwarder, which reads w.
type scopeWatch struct {
	service string
	want    *scopeWant // nil for the all scope
	w       jetstream.KeyWatcher
	cancel  context.CancelFunc

	synced  bool
	stopped bool
	// The copy being built from the initial values, until the catch-up
	// marker.
	fresh        map[string]map[string]*mirrorEntry
	freshSkipped map[string]struct{}
	freshRev     uint64 // the highest revision among the initial values
	// freshRevs is freshRev per service, for the all scope.
	freshRevs map[string]uint64
}

// freshServiceRev records an initial value of the all scope at rev.
func (sw *scopeWatch) freshServiceRev(key string, rev uint64) {
	service := serviceOfKey(key)
	if cur, ok := sw.freshRevs[service]; ok {
		sw.freshRevs[service] = max(cur, rev)
		return
	}
	if sw.freshRevs == nil {
		sw.freshRevs = make(map[string]uint64)
	}
	sw.freshRevs[strings.Clone(service)] = rev
}

// serviceOfKey is the service part of a record's key.
func serviceOfKey(key string) string {
	service, _, _ := strings.Cut(key, ".")
	return service
}

// revisions maps services to the revision of their last entry applied:
// written by the mirror's goroutine, read by any.
type revisions struct{ m sync.Map } // service -> *atomic.Uint64

// note raises service's revision to rev.
func (r *revisions) note(service string, rev uint64) {
	v, ok := r.m.Load(service)
	if !ok {
		v, _ = r.m.LoadOrStore(strings.Clone(service), new(atomic.Uint64))
	}
	if a := v.(*atomic.Uint64); rev > a.Load() {
		a.Store(rev)
	}
}

// get returns service's revision, 0 for none.
func (r *revisions) get(service string) uint64 {
	if v, ok := r.m.Load(service); ok {
		return v.(*atomic.Uint64).Load()
	}
	return 0
}

func newScopeWatch(service string, want *scopeWant, w jetstream.KeyWatcher, cancel context.CancelFunc) *scopeWatch {
	return &scopeWatch{
		service: service, want: want, w: w, cancel: cancel,
		fresh: make(map[string]map[string]*mirrorEntry), freshSkipped: make(map[string]struct{}),
	}
}

// applied records a live entry of the watch at revision rev.
func (sw *scopeWatch) applied(rev uint64) {
	if sw == nil {
		return
	}
	if sw.want != nil && rev > sw.want.rev.Load() {
		sw.want.rev.Store(rev)
	}
}

// scopedUpdate is an entry of a service's watch on its way to the mirror's
// goroutine; closed says the watch ended.
type scopedUpdate struct {
	sw     *scopeWatch
	e      jetstream.KeyValueEntry
	closed bool
}

// session is the watches of one run of Mirror.watch, which ends them all
// when it returns (a reconnect resyncs every one).
type session struct {
	in     chan scopedUpdate
	scopes map[string]*scopeWatch // by service; "" for the all scope
	wg     sync.WaitGroup         // the forwarders
	// stopping counts the watches' stops still deleting their consumers
	// (stopWatcherAsync): the mirror's, which waits for them as it ends.
	stopping *sync.WaitGroup
	synced   bool // a watch of this session reached its catch-up marker
}

// stop ends every watch of the session and waits for the forwarders.
func (ss *session) stop() {
	for _, sw := range ss.scopes {
		ss.stopScope(sw)
	}
	ss.wg.Wait()
}

// stopScope ends sw's watch; its entries still on their way are ignored.
func (ss *session) stopScope(sw *scopeWatch) {
	if sw.stopped {
		return
	}
	sw.stopped = true
	sw.cancel()
	_ = stopWatcherAsync(sw.w, ss.stopping)
}

// forward carries sw's entries to the mirror's goroutine until the watch
// ends or ctx (sw's) does.
func (ss *session) forward(ctx context.Context, sw *scopeWatch) {
	defer ss.wg.Done()
	updates := sw.w.Updates()
	for {
		select {
		case e, ok := <-updates:
			select {
			case ss.in <- scopedUpdate{sw: sw, e: e, closed: !ok}:
			case <-ctx.Done():
				return
			}
			if !ok {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// Follow makes a scoped mirror hold the records of service and returns
// once it does: its watch has delivered every record the bucket held
// (none, for a service nobody registered). A service followed already
// returns at once when synced. It may be called before Start (the first
// sync then includes the service). It returns ErrClosed once the mirror
// is closed, ctx's error, or an error wrapping events.ErrInvalidService.
// On a mirror that is not scoped, which holds every record, it is
// WaitSynced.
func (m *Mirror) Follow(ctx context.Context, service string) error {
	if !m.cfg.Scoped {
		return m.WaitSynced(ctx)
	}
	if err := events.ValidateService(service); err != nil {
		return fmt.Errorf("serverlist: follow: %w", err)
	}
	m.scopeMu.Lock()
	w := m.wants[service]
	if w == nil {
		w = &scopeWant{synced: make(chan struct{})}
		m.wants[service] = w
	}
	m.scopeMu.Unlock()
	m.signalScope()
	select {
	case <-w.synced:
		return nil
	default:
	}
	select {
	case <-w.synced:
		return nil
	case <-m.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Unfollow makes a scoped mirror forget service: its watch stops and its
// records leave the index, without an OnChange call, soon after Unfollow
// returns (it does not wait). A Follow of the same service afterwards
// starts a new watch. It does nothing on a mirror that is not scoped, or
// for a service not followed. It must not be called from OnChange or
// OnRefresh.
func (m *Mirror) Unfollow(service string) {
	if !m.cfg.Scoped {
		return
	}
	m.scopeMu.Lock()
	_, ok := m.wants[service]
	delete(m.wants, service)
	m.scopeMu.Unlock()
	if ok {
		m.signalScope()
	}
}

// Followed returns the services a scoped mirror follows, sorted; nil for
// a mirror that is not scoped.
func (m *Mirror) Followed() []string {
	if !m.cfg.Scoped {
		return nil
	}
	m.scopeMu.Lock()
	defer m.scopeMu.Unlock()
	out := slices.Collect(maps.Keys(m.wants))
	slices.Sort(out)
	return out
}

// ServiceRevision returns the revision of the last registry entry of
// service the mirror applied (a put, a refresh or a removal of one of its
// records): once it reaches r, the read methods reflect every entry of
// the service up to revision r. Two mirrors of one bucket, scoped or not,
// that applied the same entries of a service report the same revision for
// it, so that clients can be compared. 0 for a service the mirror has no
// entry of, or that a scoped mirror does not follow or has not synced.
func (m *Mirror) ServiceRevision(service string) uint64 {
	if !m.cfg.Scoped {
		return m.serviceRevs.get(service)
	}
	m.scopeMu.Lock()
	w := m.wants[service]
	m.scopeMu.Unlock()
	if w == nil {
		return 0
	}
	return w.rev.Load()
}

func (m *Mirror) signalScope() {
	select {
	case m.scopeSignal <- struct{}{}:
	default:
	}
}

// rescope makes the session's watches match the followed services: it
// stops the watches of services unfollowed (or unfollowed and followed
// again) and forgets their records, forgets the records of services
// unfollowed between sessions, and starts a watch for each followed
// service without one. The first time every service followed then has
// synced, the mirror is synced (WaitSynced).
func (m *Mirror) rescope(ctx context.Context, ss *session) error {
	m.scopeMu.Lock()
	wants := maps.Clone(m.wants)
	m.scopeMu.Unlock()
	for name, sw := range ss.scopes {
		if wants[name] != sw.want {
			ss.stopScope(sw)
			delete(ss.scopes, name)
			m.dropService(name)
		}
	}
	for name := range m.state.Load().services {
		if wants[name] == nil {
			m.dropService(name)
		}
	}
	names := slices.Sorted(maps.Keys(wants))
	for _, name := range names {
		if _, ok := ss.scopes[name]; ok {
			continue
		}
		// The client ties the subscription to this context; cancelling it
		// (stopScope) also ends the client's goroutine waiting on it.
		wctx, cancel := context.WithCancel(ctx)
		w, err := m.reg.kv.Watch(wctx, name+".*") // the service's records, not their leases
		if err != nil {
			cancel()
			return fmt.Errorf("serverlist: watch %s: %w", name, err)
		}
		sw := newScopeWatch(name, wants[name], w, cancel)
		ss.scopes[name] = sw
		ss.wg.Add(1)
		go ss.forward(wctx, sw)
	}
	m.checkSynced(ss)
	return nil
}

// install swaps in sw's fresh copy at its catch-up marker.
func (m *Mirror) install(ss *session, sw *scopeWatch) {
	ss.synced = true
	if sw.service == "" {
		// The revisions before the swap's OnChange calls: a subscriber
		// that reconciles a service on its OnChange reads them.
		for service, rev := range sw.freshRevs {
			m.serviceRevs.note(service, rev)
		}
		sw.freshRevs = nil
		m.swap(sw.fresh, sw.freshRev)
		m.skippedMu.Lock()
		m.skipped = sw.freshSkipped
		m.skippedMu.Unlock()
	} else {
		sw.applied(sw.freshRev)
		m.swapService(sw.service, sw.fresh[sw.service], sw.freshRev)
		m.replaceSkipped(sw.service, sw.freshSkipped)
		sw.want.markSynced()
	}
	sw.fresh, sw.freshSkipped = nil, nil
	m.checkSynced(ss)
}

// checkSynced marks the mirror synced once every watch of the session
// has synced.
func (m *Mirror) checkSynced(ss *session) {
	if m.Synced() {
		return
	}
	for _, sw := range ss.scopes {
		if !sw.synced {
			return
		}
	}
	m.syncOnce.Do(func() { close(m.synced) })
}

// swapService installs the freshly synced entries of one service (ids;
// none when it has no record), whose last entry has revision rev, and
// calls OnChange when they differ from the service's list before.
func (m *Mirror) swapService(service string, ids map[string]*mirrorEntry, rev uint64) {
	cur := m.state.Load()
	before := cur.instances(service)
	services := maps.Clone(cur.services)
	if services == nil {
		services = make(map[string]*mirrorService, 1)
	}
	if len(ids) == 0 {
		delete(services, service)
	} else {
		services[service] = newMirrorService(service, listOf(ids))
	}
	m.state.Store(&mirrorState{services: services})
	for _, e := range before {
		m.conns.update(service, e.rec.srv.ID, e.connKey(), connKey{})
	}
	for id, e := range ids {
		m.conns.update(service, id, connKey{}, e.connKey())
	}
	m.instances.Add(int64(len(ids) - len(before)))
	m.syncs.Add(1)
	// Published after the OnChange call, as in watch.
	defer m.advanceRevision(rev)
	if m.cfg.OnChange != nil && m.resynced(service, ids, before) {
		m.cfg.OnChange(service)
	}
}

// dropService forgets the records of service, without an OnChange call.
func (m *Mirror) dropService(service string) {
	m.replaceSkipped(service, nil)
	cur := m.state.Load()
	before := cur.instances(service)
	if cur.services[service] == nil {
		return
	}
	services := maps.Clone(cur.services)
	delete(services, service)
	m.state.Store(&mirrorState{services: services})
	for _, e := range before {
		m.conns.update(service, e.rec.srv.ID, e.connKey(), connKey{})
	}
	m.instances.Add(-int64(len(before)))
}

// replaceSkipped replaces the skipped keys of service with those of
// fresh (see Mirror.skipped).
func (m *Mirror) replaceSkipped(service string, fresh map[string]struct{}) {
	prefix := service + "."
	m.skippedMu.Lock()
	defer m.skippedMu.Unlock()
	for k := range m.skipped {
		if strings.HasPrefix(k, prefix) {
			delete(m.skipped, k)
		}
	}
	maps.Copy(m.skipped, fresh)
}
