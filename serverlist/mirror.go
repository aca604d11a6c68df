package serverlist

// The mirror: its configuration, lifecycle and counters, and the watch
// loop that follows the bucket (reconnects, resyncs, a bucket lost and
// recreated). The index it keeps is in mirror_index.go, the way each
// entry is applied to it in mirror_apply.go.

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

const (
	// DefaultMirrorRetryBackoff is the first wait after a failed watch.
	DefaultMirrorRetryBackoff = 50 * time.Millisecond
	// DefaultMirrorMaxRetryBackoff caps the wait between failed watches.
	DefaultMirrorMaxRetryBackoff = 2 * time.Second
	// DefaultBucketCheck is the interval of the mirror's check that the
	// bucket still exists.
	DefaultBucketCheck = 10 * time.Second
)

// MirrorConfig configures a [Mirror]. The zero value is usable.
type MirrorConfig struct {
	// OnChange, if set, is called with a service name after the mirror's view
	// of that service changed: an instance appeared, changed or went away.
	// A refresh that re-puts identical data is not a change. After a
	// (re)sync it is called once per service that differs from the view
	// before, in sorted order.
	//
	// Threading: OnChange is called from the mirror's goroutine, one call at
	// a time, never while the mirror holds a lock; it may call the mirror's
	// read methods. The mirror applies no further updates until it returns,
	// so it should be quick (hand the work to another goroutine if not). It
	// must not call Close, which would wait for the call to end.
	OnChange func(service string)

	// OnRefresh, if set, is called after a put that leaves an instance's
	// value as it was (a lease refresh), with the instance's incarnation and
	// the entry's new revision (see [Entry]). It is the cheap path the
	// registry's ordering needs: a registry write after an offline brings
	// the instance back, while an unchanged value changes no list. Same
	// threading rules as OnChange; it must be quick, it runs once per
	// refresh of every instance.
	OnRefresh func(service, id string, incarnation int64, revision uint64)

	// BucketCheck is the interval at which the mirror checks that the
	// bucket still exists while its watch runs. A bucket found gone (a NATS
	// server that lost its store, a deleted bucket) is recreated with the
	// registry's configuration and the mirror resyncs; a watch that fails
	// triggers the same check at once. Zero means DefaultBucketCheck
	// (10 s); a negative value turns the periodic check off.
	BucketCheck time.Duration

	// RetryBackoff is the first wait after the watch fails to start or
	// breaks; the wait doubles up to MaxRetryBackoff and resets once a watch
	// syncs. Zero means DefaultMirrorRetryBackoff (50 ms).
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the wait. Zero means DefaultMirrorMaxRetryBackoff
	// (2 s).
	MaxRetryBackoff time.Duration

	// Scoped, when true, makes the mirror hold the records of the services
	// given to Follow only, each followed by a watch of its own keys, so
	// that the mirror (and the NATS server, which sends it nothing else)
	// pays for the services a client routes, not for the fleet. False
	// (the default) mirrors every record with one watch.
	Scoped bool
	// Services are the services a scoped mirror follows from the start, as
	// if given to Follow before Start: the first sync holds them.
	Services []string

	// Logger receives watch failures and malformed entries. The zero value
	// logs nothing.
	Logger zerolog.Logger
}

// MirrorStats are counters since the mirror was created.
type MirrorStats struct {
	// Instances is the number of instances the mirror holds now.
	Instances int `json:"instances"`
	// Puts and Removals count the entries applied (initial values included).
	Puts     uint64 `json:"puts"`
	Removals uint64 `json:"removals"`
	// MalformedKeys counts entries skipped because their key does not decode;
	// MalformedValues those whose value is not a valid Instance for its key.
	MalformedKeys   uint64 `json:"malformedKeys"`
	MalformedValues uint64 `json:"malformedValues"`
	// Collisions counts copies of another region's records skipped
	// because this region's own record holds the same ID (QualifiedID).
	Collisions uint64 `json:"collisions,omitempty"`
	// Syncs counts completed (re)syncs: the first, then one per reconnect or
	// broken watch.
	Syncs uint64 `json:"syncs"`
	// WatchErrors counts watches that failed to start or broke.
	WatchErrors uint64 `json:"watchErrors"`
	// Refreshes counts puts that left an instance's value unchanged (lease
	// refreshes): they update its revision and call OnRefresh, nothing else.
	Refreshes uint64 `json:"refreshes"`
	// BucketsRecreated counts the times the mirror found the bucket gone and
	// recreated it.
	BucketsRecreated uint64 `json:"bucketsRecreated"`
	// WentBack counts the times the bucket came back with an older state
	// than the mirror had applied (lost acknowledged writes).
	WentBack uint64 `json:"wentBack"`
	// Revision is the bucket revision of the last entry applied. Once it
	// reaches r, the read methods reflect every entry up to revision r and
	// OnChange has returned for them (in a scoped mirror, whose services
	// are followed by watches of their own, this holds per service: see
	// ServiceRevision), so a test or a caller that wrote at
	// revision r (Registry.Register returns it) can wait for it instead of
	// guessing. It never goes down: a resync reflects the bucket at least as
	// of every revision applied before it. When the bucket is replaced by a
	// new one (recreated after a loss), whose revisions start again at 1,
	// or goes back in time (lost writes), the mirror maps the bucket's
	// revisions above the last it applied (mirror_revisions.go), so
	// revisions it reports ([Entry], Revision) keep their order.
	Revision uint64 `json:"revision"`
}

// Mirror is a local copy of the registry bucket, kept current by a KV watch,
// so that looking an instance up is a map read.
//
// The watch starts with every current entry and then follows puts, deletes,
// purges and lease expiries. When the NATS connection comes back after a
// disconnect (a server restart, a network cut), or the watch breaks, the
// mirror starts a fresh watch and resyncs: it builds a new copy from the
// bucket's current entries and swaps it in whole once caught up. Until then,
// and for as long as NATS stays away, it serves the last known state.
//
// Entries whose key or value is malformed are logged, counted and skipped; a
// malformed put leaves the last good value of that key in place.
//
// Read methods are safe for concurrent use, take no lock and return copies:
// each service's instances are an immutable map behind an atomic pointer,
// replaced (copy on write: that service's map only) by the mirror's single
// goroutine when something actually changes. A read of one service sees
// one state of it; reads of two services may see them at different
// revisions. A refresh that re-puts identical data costs a comparison, not
// a copy.
type Mirror struct {
	reg *Registry
	cfg MirrorConfig
	log zerolog.Logger

	state atomic.Pointer[mirrorState]

	lifeMu  sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when the goroutine ends
	// stopping counts the stopped watches whose consumers are still being
	// deleted (stopWatcherAsync); the goroutine waits for them as it ends.
	stopping sync.WaitGroup
	synced   chan struct{} // closed at the first catch-up
	syncOnce sync.Once

	puts, removals, malformedKeys, malformedValues atomic.Uint64
	collisions                                     atomic.Uint64 // see displaces
	syncs, watchErrors, revision                   atomic.Uint64
	refreshes, recreated, wentBack                 atomic.Uint64
	instances                                      atomic.Int64

	seed maphash.Seed // of valueSum

	conns connIndex // records by the NATS connection that holds them (mirror_conns.go)
	// shared keeps one copy of the zones and labels records repeat
	// (mirror_compact.go); only the mirror's goroutine uses it.
	shared interner
	// labelSets keeps one copy of the sets of labels records repeat
	// (mirror_compact.go); only the mirror's goroutine uses it.
	labelSets labelSets

	// skipped holds the keys of the records the bucket holds that the
	// index leaves out: a malformed key or value (with no earlier good
	// value), or a record marked down. The reaper's sweep reads them with
	// the index (ReaperConfig.Mirror), so that it sees every record. The
	// mirror's goroutine writes it, under skippedMu; it is usually empty.
	skippedMu sync.Mutex
	skipped   map[string]struct{}

	// serviceRevs holds, in a mirror that is not scoped, the revision of
	// the last entry of each service applied (ServiceRevision); a scoped
	// mirror keeps it per followed service (scopeWant.rev).
	serviceRevs revisions

	// The services a scoped mirror follows (mirror_scope.go): Follow and
	// Unfollow change wants under scopeMu and signal scopeSignal; the
	// mirror's goroutine starts and stops the watches to match.
	scopeMu     sync.Mutex
	wants       map[string]*scopeWant
	scopeSignal chan struct{}

	// Only the mirror's goroutine touches these.
	revs bucketRevisions // the bucket's revisions as the mirror's (mirror_revisions.go)
}

// NewMirror returns a mirror of reg's bucket. It starts no goroutine and
// watches nothing until Start.
func NewMirror(reg *Registry, cfg MirrorConfig) *Mirror {
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = DefaultMirrorRetryBackoff
	}
	if cfg.MaxRetryBackoff <= 0 {
		cfg.MaxRetryBackoff = DefaultMirrorMaxRetryBackoff
	}
	cfg.MaxRetryBackoff = max(cfg.MaxRetryBackoff, cfg.RetryBackoff)
	if cfg.BucketCheck == 0 {
		cfg.BucketCheck = DefaultBucketCheck
	}
	m := &Mirror{
		reg:     reg,
		cfg:     cfg,
		log:     cfg.Logger,
		done:    make(chan struct{}),
		synced:  make(chan struct{}),
		seed:    maphash.MakeSeed(),
		skipped: make(map[string]struct{}),

		wants:       make(map[string]*scopeWant),
		scopeSignal: make(chan struct{}, 1),
	}
	m.state.Store(&mirrorState{})
	if cfg.Scoped {
		for _, svc := range cfg.Services {
			m.wants[svc] = &scopeWant{synced: make(chan struct{})}
		}
	}
	return m
}

// Start starts the watch in a goroutine that runs until Close is called,
// ctx ends, or the application closes the NATS connection; use a long-lived
// ctx, not a request's. It does not wait for the first sync (see
// WaitSynced). It returns ErrClosed after Close and an error if the mirror
// was already started.
func (m *Mirror) Start(ctx context.Context) error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.stopped {
		return ErrClosed
	}
	if m.started {
		return errors.New("serverlist: mirror already started")
	}
	m.started = true
	ctx, m.cancel = context.WithCancel(ctx)
	go m.run(ctx)
	return nil
}

// Close stops the watch and waits for the mirror's goroutine to end. The
// mirror keeps serving its last state. Close is idempotent, may be called
// before Start, and always returns nil; the error is there to match the
// other components' Close.
func (m *Mirror) Close() error {
	m.lifeMu.Lock()
	if !m.stopped {
		m.stopped = true
		if m.cancel != nil {
			m.cancel()
		} else {
			close(m.done) // never started
		}
	}
	m.lifeMu.Unlock()
	<-m.done
	return nil
}

// WaitSynced waits until the mirror has caught up with the bucket once. It
// returns nil at once if it has, ErrClosed if the mirror was closed (or its
// ctx ended) before that, or ctx's error.
func (m *Mirror) WaitSynced(ctx context.Context) error {
	select {
	case <-m.synced:
		return nil
	default:
	}
	select {
	case <-m.synced:
		return nil
	case <-m.done:
		select {
		case <-m.synced:
			return nil
		default:
			return ErrClosed
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Synced reports whether the mirror has caught up with the bucket once.
func (m *Mirror) Synced() bool {
	select {
	case <-m.synced:
		return true
	default:
		return false
	}
}

// Revision is MirrorStats.Revision, read alone.
func (m *Mirror) Revision() uint64 { return m.revision.Load() }

// Stats returns the mirror's counters.
func (m *Mirror) Stats() MirrorStats {
	return MirrorStats{
		Instances:        int(m.instances.Load()),
		Puts:             m.puts.Load(),
		Removals:         m.removals.Load(),
		MalformedKeys:    m.malformedKeys.Load(),
		MalformedValues:  m.malformedValues.Load(),
		Collisions:       m.collisions.Load(),
		Syncs:            m.syncs.Load(),
		WatchErrors:      m.watchErrors.Load(),
		Refreshes:        m.refreshes.Load(),
		BucketsRecreated: m.recreated.Load(),
		WentBack:         m.wentBack.Load(),
		Revision:         m.revision.Load(),
	}
}

// advanceRevision publishes rev as applied unless a higher one was. Only the
// mirror's goroutine calls it.
func (m *Mirror) advanceRevision(rev uint64) {
	if rev > m.revision.Load() {
		m.revision.Store(rev)
	}
}

// errReconnected ends a watch so that the loop resyncs.
var errReconnected = errors.New("serverlist: NATS reconnected")

// errBucketGone ends a watch whose bucket was found missing.
var errBucketGone = errors.New("serverlist: registry bucket is gone")

// bucketCheckTimeout bounds one check of the bucket.
const bucketCheckTimeout = 5 * time.Second

// ensureBucket recreates the bucket if it is gone and reports whether it
// did.
func (m *Mirror) ensureBucket(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, bucketCheckTimeout)
	defer cancel()
	created, err := m.reg.Ensure(cctx)
	if err != nil {
		m.log.Debug().Err(err).Str("bucket", m.reg.cfg.Bucket).Msg("serverlist: cannot check the registry bucket")
		return false
	}
	if created {
		m.recreated.Add(1)
	}
	return created
}

// bucketGone reports whether a check finds the bucket missing. Other
// failures (NATS away) are not a verdict.
func (m *Mirror) bucketGone(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, bucketCheckTimeout)
	defer cancel()
	_, err := m.reg.js.KeyValue(cctx, m.reg.cfg.Bucket)
	return errors.Is(err, jetstream.ErrBucketNotFound)
}

// noteBucket reads the creation time and the last sequence of the
// bucket's stream before a watch, so that the revisions the mirror reports
// keep their order across a new bucket or one that went back in time
// (bucketRevisions). A watch without them could take new writes for old
// ones: the error it returns makes the run loop try again (a cluster
// whose stream has no leader yet), or recreate a bucket that is gone.
func (m *Mirror) noteBucket(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, bucketCheckTimeout)
	defer cancel()
	st, err := m.reg.kv.Status(cctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return errBucketGone
	}
	if err != nil {
		return fmt.Errorf("serverlist: read the registry bucket's state: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return nil
	}
	info := bs.StreamInfo()
	applied := m.revision.Load()
	switch m.revs.note(info.Created, info.State.LastSeq, applied) {
	case newBucket:
		m.log.Info().Str("bucket", m.reg.cfg.Bucket).Uint64("revision_base", applied).
			Msg("serverlist: the registry bucket is a new one; its revisions continue from the last applied")
	case wentBack:
		m.wentBack.Add(1)
		m.log.Warn().Str("bucket", m.reg.cfg.Bucket).Uint64("last_sequence", info.State.LastSeq).Uint64("revision", applied).
			Msg("serverlist: the registry bucket went back in time (its stream lost writes this mirror applied: a server or cluster that lost acknowledged writes); its writes from now on are ordered after the last applied, and publishers write their records back")
	}
	return nil
}

// run owns the watch: it (re)starts it until ctx ends, backing off after
// failures.
func (m *Mirror) run(ctx context.Context) {
	defer close(m.done)
	defer m.stopping.Wait()
	nc := m.reg.js.Conn()
	// A status listener does not replace the application's reconnect handler;
	// nats.go sends to it without blocking.
	status := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(status)

	backoff := m.cfg.RetryBackoff
	for {
		// Reconnects before this watch starts are covered by it.
		drainStatus(status)
		synced, err := m.watch(ctx, status)
		if ctx.Err() != nil {
			return
		}
		if synced {
			backoff = m.cfg.RetryBackoff
		}
		if errors.Is(err, errReconnected) {
			m.log.Info().Str("bucket", m.reg.cfg.Bucket).Msg("serverlist: NATS reconnected, resyncing mirror")
			continue
		}
		if !errors.Is(err, errBucketGone) {
			m.watchErrors.Add(1)
		}
		if nc.IsClosed() {
			// The application closed the connection: nothing will come back.
			m.log.Warn().Err(err).Str("bucket", m.reg.cfg.Bucket).Msg("serverlist: NATS connection closed, mirror stops following the registry")
			return
		}
		// A watch fails for good when the bucket is gone (a server that
		// lost its store): recreate it, then resync at once.
		if m.ensureBucket(ctx) {
			continue
		}
		if hint := consumerLimitHint(err); hint != "" {
			m.log.Error().Err(err).Str("bucket", m.reg.cfg.Bucket).Dur("retry_in", backoff).Msg("serverlist: mirror watch failed: " + hint)
		} else {
			m.log.Warn().Err(err).Str("bucket", m.reg.cfg.Bucket).Dur("retry_in", backoff).Msg("serverlist: mirror watch failed")
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, m.cfg.MaxRetryBackoff)
	}
}

func drainStatus(ch chan nats.Status) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// watch runs one session of the mirror's watches until ctx ends, the
// connection reconnects, or a watch breaks: one watch of every record, or,
// in a scoped mirror, one per followed service (mirror_scope.go), started
// and stopped as services are followed and unfollowed. Each watch's
// initial values build a fresh copy of its scope that replaces the current
// one at its catch-up marker; later entries apply in place. It reports
// whether any watch reached its catch-up marker.
func (m *Mirror) watch(ctx context.Context, status <-chan nats.Status) (synced bool, err error) {
	if err := m.noteBucket(ctx); err != nil {
		return false, err
	}
	ss := &session{in: make(chan scopedUpdate, scopedBuffer), scopes: make(map[string]*scopeWatch), stopping: &m.stopping}
	defer ss.stop()
	// The all scope's entries are read from its watcher directly: no hop
	// through a goroutine for the follow-all mirror's 100,000 records.
	var all *scopeWatch
	var allUpdates <-chan jetstream.KeyValueEntry
	var rescope <-chan struct{}
	if m.cfg.Scoped {
		rescope = m.scopeSignal
		if err := m.rescope(ctx, ss); err != nil {
			return false, err
		}
	} else {
		// The client ties the subscription to this context; cancelling it
		// on return also ends the client's goroutine waiting on it.
		wctx, cancel := context.WithCancel(ctx)
		// Records only: leases never reach a gateway. A bounded watch, so
		// that the client holds little of the registry in flight while the
		// mirror applies it (kvwatch.go).
		w, err := m.reg.watchBounded(wctx, RecordKeys)
		if err != nil {
			cancel()
			return false, err
		}
		all = newScopeWatch("", nil, w, cancel)
		ss.scopes[""] = all
		allUpdates = w.Updates()
	}
	var check <-chan time.Time
	if m.cfg.BucketCheck > 0 {
		t := time.NewTicker(m.cfg.BucketCheck)
		defer t.Stop()
		check = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ss.synced, ctx.Err()
		case <-status:
			return ss.synced, errReconnected
		case <-check:
			// A deleted bucket does not always break the watch: look.
			if m.bucketGone(ctx) {
				return ss.synced, errBucketGone
			}
		case <-rescope:
			if err := m.rescope(ctx, ss); err != nil {
				return ss.synced, err
			}
		case e, ok := <-allUpdates:
			// A burst (the fleet's lease refreshes arrive by the thousand
			// per second) is drained entry by entry without going back
			// through this select for each, up to drainBatch at a time.
			for n := 1; ; n++ {
				if !ok {
					return ss.synced, errors.New("serverlist: watcher closed")
				}
				m.handle(ss, all, e)
				var got bool
				if n == drainBatch {
					break
				}
				if e, ok, got = tryReceive(allUpdates); !got {
					break
				}
			}
		case u := <-ss.in:
			for n := 1; ; n++ {
				if u.closed {
					return ss.synced, fmt.Errorf("serverlist: watcher of %s closed", u.sw.service)
				}
				m.handle(ss, u.sw, u.e)
				if n == drainBatch {
					break
				}
				var got bool
				if u, got = tryReceiveScoped(ss.in); !got {
					break
				}
			}
		}
	}
}

// handle applies one update of sw's watch: an initial value to its fresh
// copy, the catch-up marker (nil), or a live entry.
func (m *Mirror) handle(ss *session, sw *scopeWatch, e jetstream.KeyValueEntry) {
	switch {
	case sw.stopped:
		// Unfollowed while its entries were on their way.
	case e == nil:
		if !sw.synced {
			sw.synced = true
			m.install(ss, sw)
		}
	case !sw.synced:
		rev := m.revs.of(e.Revision())
		m.applyFresh(sw.fresh, sw.freshSkipped, e, rev)
		sw.freshRev = max(sw.freshRev, rev)
		if sw.service == "" {
			sw.freshServiceRev(e.Key(), rev)
		}
	default:
		rev := m.revs.of(e.Revision())
		m.apply(e, rev, sw)
		// Again for the entries apply calls no OnChange for (refreshes,
		// skipped ones).
		m.noteServiceRevision(sw, e.Key(), rev)
		// Published last: a reader that sees this revision sees its
		// effect and the OnChange call for it.
		m.advanceRevision(rev)
	}
}

// drainBatch bounds the entries the watch applies before it looks at its
// other channels (stop, reconnect, bucket check) again.
const drainBatch = 1024

// tryReceiveScoped is tryReceive of a scoped mirror's updates.
func tryReceiveScoped(ch <-chan scopedUpdate) (u scopedUpdate, got bool) {
	select {
	case u = <-ch:
		return u, true
	default:
		return u, false
	}
}

// tryReceive receives from ch if a value (or the close) is ready; got
// reports whether one was.
func tryReceive(ch <-chan jetstream.KeyValueEntry) (e jetstream.KeyValueEntry, ok, got bool) {
	select {
	case e, ok = <-ch:
		return e, ok, true
	default:
		return nil, false, false
	}
}
