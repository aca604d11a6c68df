package serverlist

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
)

// DefaultSweepInterval is the pace of a leading reaper's sweep for records
// that have no lease (see [Reaper]).
const DefaultSweepInterval = 5 * time.Minute

// ReaperConfig configures [NewReaper]. The zero value is usable.
type ReaperConfig struct {
	// Node names this reaper in the lock while it leads. Empty means
	// "<hostname>-<pid>".
	Node string
	// SweepInterval is how often the leader lists the records to find those
	// that have no lease (a publisher that died between its record and its
	// lease, or leases that ran out while no reaper led). A record found
	// without a lease at two sweeps in a row, unchanged, is removed. The
	// first sweep after taking the lead follows the initial one after one
	// TTL. Zero means DefaultSweepInterval.
	SweepInterval time.Duration
	// Logger receives elections, removals and failures. The zero value logs
	// nothing.
	Logger zerolog.Logger
	// Mirror, when set, is a mirror of the same bucket (a gateway's own):
	// once it is synced, a sweep takes the records from it instead of
	// listing every record again, and lists the leases of its services
	// a batch of services at a time (sweepBatch), so that the messages
	// queued for the leader stay few. Nil: every sweep lists the bucket.
	Mirror *Mirror
}

// ReaperStats count what a reaper did. Safe to read at any time.
type ReaperStats struct {
	// Leader reports whether this reaper leads now.
	Leader bool `json:"leader"`
	// Terms counts the times it took the lead.
	Terms uint64 `json:"terms"`
	// LeasesEnded counts the lease removals and expiries it saw while
	// leading.
	LeasesEnded uint64 `json:"leasesEnded"`
	// Reaped counts the records it removed.
	Reaped uint64 `json:"reaped"`
	// Sweeps counts its sweeps for records without a lease.
	Sweeps uint64 `json:"sweeps"`
	// MirroredSweeps counts the sweeps that took the records from the
	// mirror (ReaperConfig.Mirror) instead of listing them.
	MirroredSweeps uint64 `json:"mirroredSweeps"`
	// Errors counts failed watches, reads and removals.
	Errors uint64 `json:"errors"`
	// NotPermitted reports that the NATS account may not write the lock:
	// this process cannot reap and does not try again until restarted. It
	// watches the lock instead, to tell when no reaper leads.
	NotPermitted bool `json:"notPermitted"`
	// Unled reports, for a reaper that may not lead, that no reaper has
	// held the lock for more than a TTL: crashed instances are not being
	// removed (a warning is logged when it becomes true).
	Unled bool `json:"unled"`
}

// Reaper turns the end of a lease into the removal of its record, for the
// records written by [Registry.Claim], which never age out by themselves.
//
// Many processes may run a Reaper over one bucket (every gateway does by
// default): they elect one leader with a create-only write of
// [ReaperLockKey], which the leader renews at a third of the TTL and which
// ages out with the bucket's TTL when the leader dies; the others watch the
// lock key alone. The leader consumes the leases' expiry signals
// (lease_schedule.go): one message per lease that was not renewed for a
// lease, none per renewal. For each, unless the lease was renewed after the
// signal, it ends the lease (conditionally on its revision, so a renewal
// racing it wins) and removes the record if it was written before the
// signal, conditionally on its revision, so a record rewritten by a new
// holder is never removed. Plain leases (a bucket that cannot schedule,
// publishers of an earlier release) have no signal: while there are any,
// the leader also watches every lease write, as before scheduled leases,
// and removes the record of a lease that was removed or ran out. Its sweeps
// remove records that have had no lease for a whole sweep interval, and
// tell whether plain leases remain.
//
// A process whose NATS account may not write the lock (a gateway with
// read-only permissions) logs it once and stays out of the election; see
// docs/security.md for the reaper's permissions.
type Reaper struct {
	reg *Registry
	cfg ReaperConfig
	log zerolog.Logger

	leader, notPermitted, unled                    atomic.Bool
	terms, leasesEnded, reaped, sweeps, errorsSeen atomic.Uint64
	mirroredSweeps                                 atomic.Uint64
	plainMessages                                  atomic.Uint64
	// leasePurgeRefused: the account may not end leases (scheduled path).
	leasePurgeRefused atomic.Bool

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewReaper returns a reaper over reg. It starts nothing until Start.
func NewReaper(reg *Registry, cfg ReaperConfig) *Reaper {
	if cfg.Node == "" {
		host, _ := os.Hostname()
		cfg.Node = host + "-" + strconv.Itoa(os.Getpid())
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	return &Reaper{reg: reg, cfg: cfg, log: cfg.Logger}
}

// Start runs the reaper in a goroutine until Close. It returns at once.
func (r *Reaper) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return errors.New("serverlist: reaper already started")
	}
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		r.run(ctx)
	}()
	return nil
}

// Close stops the reaper and waits for its goroutine; a leader gives the
// lock up, so another reaper takes the lead at once. Idempotent.
func (r *Reaper) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	<-r.done
	r.cancel = nil
	return nil
}

// Leader reports whether this reaper leads now.
func (r *Reaper) Leader() bool { return r.leader.Load() }

// PlainMessages counts the lease writes and removals this reaper received
// while leading on the plain path (leases without an expiry signal): every
// renewal of such a lease is one. Zero while every lease is scheduled.
func (r *Reaper) PlainMessages() uint64 { return r.plainMessages.Load() }

// Stats returns the reaper's counters.
func (r *Reaper) Stats() ReaperStats {
	return ReaperStats{
		Leader: r.leader.Load(), Terms: r.terms.Load(), LeasesEnded: r.leasesEnded.Load(),
		Reaped: r.reaped.Load(), Sweeps: r.sweeps.Load(), MirroredSweeps: r.mirroredSweeps.Load(), Errors: r.errorsSeen.Load(),
		NotPermitted: r.notPermitted.Load(), Unled: r.unled.Load(),
	}
}

const (
	// reaperRetry is the wait after a failure before the next attempt.
	reaperRetry = time.Second
	// lockWriteTimeout bounds a write of the lock.
	lockWriteTimeout = 2 * time.Second
)

func (r *Reaper) run(ctx context.Context) {
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, lockWriteTimeout)
		rev, err := r.reg.kv.Create(cctx, ReaperLockKey, []byte(r.cfg.Node))
		cancel()
		switch {
		case err == nil:
			r.lead(ctx, rev)
			continue
		case errors.Is(err, jetstream.ErrKeyExists):
			err = r.follow(ctx)
		case err != nil && r.refused(err):
			r.notPermitted.Store(true)
			r.log.Info().Err(err).Str("bucket", r.reg.cfg.Bucket).
				Msg("serverlist: this process may not write the reaper lock, so it does not reap; another process must (docs/security.md)")
			r.watchLeaders(ctx)
			return
		}
		if err != nil && ctx.Err() == nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Msg("serverlist: reaper election")
			sleepCtx(ctx, reaperRetry)
		}
	}
}

// refused reports whether err, the answer to a write of the lock, is the
// server's refusal: a permissions violation is reported asynchronously and
// the write's request then times out, so the connection's last error tells.
func (r *Reaper) refused(err error) bool { return r.refusedOn(err, ReaperLockKey) }

// refusedOn is refused for a write of key.
func (r *Reaper) refusedOn(err error, key string) bool {
	if errors.Is(err, nats.ErrPermissionViolation) {
		return true
	}
	last := r.reg.js.Conn().LastError()
	return last != nil && errors.Is(last, nats.ErrPermissionViolation) &&
		strings.Contains(last.Error(), r.reg.subject(key))
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// watchLeaders watches the lock until ctx ends, for a reaper that may not
// lead: when no reaper has held it for more than a TTL, it logs a warning
// (once per absence) and reports Unled, since crashed instances are then
// not removed.
func (r *Reaper) watchLeaders(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.watchLock(ctx, r.reg.cfg.TTL); err != nil && ctx.Err() == nil {
			r.errorsSeen.Add(1)
			sleepCtx(ctx, reaperRetry)
		}
	}
}

// watchLockKey starts a watch of the lock; stop ends it and drains it.
func (r *Reaper) watchLockKey(ctx context.Context) (w jetstream.KeyWatcher, stop func(), err error) {
	wctx, cancel := context.WithCancel(ctx)
	w, err = r.reg.kv.Watch(wctx, ReaperLockKey)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("watch the reaper lock: %w", err)
	}
	return w, func() { stopWatcher(w); cancel() }, nil
}

// watchLock is one watch of the lock for watchLeaders.
func (r *Reaper) watchLock(ctx context.Context, ttl time.Duration) error {
	w, stop, err := r.watchLockKey(ctx)
	if err != nil {
		return err
	}
	defer stop()
	absent := time.NewTimer(ttl) // stopped while a reaper holds the lock
	defer absent.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-absent.C:
			if !r.unled.Swap(true) {
				r.log.Warn().Str("bucket", r.reg.cfg.Bucket).Dur("for", ttl).
					Msg("serverlist: no reaper has led for a lease: the records of crashed instances are not removed; run a process with the reaper's permissions (docs/security.md)")
			}
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return errors.New("the reaper lock's watch ended")
			case e == nil:
			case e.Operation() == jetstream.KeyValuePut:
				absent.Stop()
				if r.unled.Swap(false) {
					r.log.Info().Msg("serverlist: a reaper leads again")
				}
			default:
				absent.Reset(ttl)
			}
		}
	}
}

// follow watches the lock until it is gone (its leader gave it up or died).
func (r *Reaper) follow(ctx context.Context) error {
	w, stop, err := r.watchLockKey(ctx)
	if err != nil {
		return err
	}
	defer stop()
	held := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return errors.New("the reaper lock's watch ended")
			case e == nil:
				if !held {
					return nil // gone before the watch began
				}
			case e.Operation() == jetstream.KeyValuePut:
				held = true
			default:
				return nil
			}
		}
	}
}

// lead reaps while this reaper holds the lock at revision rev, and gives
// the lock up when ctx ends.
//
// With scheduled leases (lease_schedule.go) it consumes the expiry signals
// alone, one message per lease that ended. It also watches every lease
// write (the plain path, which receives every renewal) while the bucket
// cannot schedule, or while its sweeps find plain leases, written by
// publishers of an earlier release or of another language.
func (r *Reaper) lead(ctx context.Context, rev uint64) {
	r.leader.Store(true)
	r.terms.Add(1)
	r.log.Info().Str("node", r.cfg.Node).Msg("serverlist: leading the reapers")
	defer func() {
		r.leader.Store(false)
		if ctx.Err() != nil {
			// Give the lock up, so that another reaper leads at once.
			gctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = r.reg.kv.Purge(gctx, ReaperLockKey, jetstream.LastRevision(rev))
			cancel()
		}
	}()
	scheduled := r.scheduleLeases(ctx, true)
	stopExpiries := func() {}
	var expiries <-chan jetstream.KeyValueEntry
	watchExpiries := func() bool {
		w, stop, err := r.watchKeys(ctx, ExpiryKeys)
		if err != nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Msg("serverlist: reaper: watch the lease expiries")
			return false
		}
		stopExpiries = stop
		expiries = w.Updates()
		return true
	}
	defer func() { stopExpiries() }()
	if scheduled && !watchExpiries() {
		sleepCtx(ctx, reaperRetry)
		return
	}
	var plain *plainWatch // nil while off
	defer func() { plain.stop() }()
	if !scheduled {
		var err error
		if plain, err = r.watchPlain(ctx); err != nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Msg("serverlist: reaper: watch the leases")
			sleepCtx(ctx, reaperRetry)
			return
		}
	}

	ttl := r.reg.cfg.TTL
	renew := time.NewTicker(max(ttl/3, 100*time.Millisecond))
	defer renew.Stop()
	sweep := time.NewTimer(0) // the first sweep at once, the next after one TTL
	defer sweep.Stop()
	sweepEvery := ttl
	candidates := make(map[string]uint64) // record key -> revision, without a lease at the last sweep
	for {
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			next, err := r.reg.kv.Update(ctx, ReaperLockKey, []byte(r.cfg.Node), rev)
			if err != nil {
				if ctx.Err() == nil {
					r.log.Warn().Err(err).Msg("serverlist: reaper lost the lead")
				}
				return
			}
			rev = next
		case <-sweep.C:
			var plainLeases int
			candidates, plainLeases = r.sweep(ctx, candidates)
			sweep.Reset(sweepEvery)
			sweepEvery = r.cfg.SweepInterval
			if !scheduled && r.scheduleLeases(ctx, false) {
				// An operator allowed schedules: leases written from now
				// on carry their signal.
				if !watchExpiries() {
					return
				}
				scheduled = true
				r.log.Info().Str("bucket", r.reg.cfg.Bucket).Msg("serverlist: reaper: the registry bucket allows message schedules now: consuming the lease expiry signals")
			}
			if !scheduled || (plain != nil) == (plainLeases > 0) || plainLeases < 0 {
				break
			}
			if plain != nil {
				r.log.Info().Msg("serverlist: reaper: every lease is scheduled now; it no longer receives the renewals")
				plain.stop()
				plain = nil
				break
			}
			r.log.Info().Int("plain_leases", plainLeases).
				Msg("serverlist: reaper: leases without an expiry signal found (publishers of an earlier release, or of another client): watching every lease write until they are gone, at the cost of receiving every renewal")
			var err error
			if plain, err = r.watchPlain(ctx); err != nil {
				r.errorsSeen.Add(1)
				r.log.Warn().Err(err).Msg("serverlist: reaper: watch the leases")
				return
			}
		case e, ok := <-expiries:
			switch {
			case !ok:
				r.errorsSeen.Add(1)
				return
			case e == nil, e.Operation() != jetstream.KeyValuePut:
				// The end of the expiries still held, or one aging out.
			default:
				if rec, ok := RecordOfExpiry(e.Key()); ok {
					r.leasesEnded.Add(1)
					r.expire(ctx, rec, e.Revision())
				}
			}
		case e, ok := <-plain.updates():
			switch {
			case !ok:
				r.errorsSeen.Add(1)
				return
			case e == nil:
			case e.Operation() == jetstream.KeyValuePut:
				r.plainMessages.Add(1)
				plain.live[e.Key()] = e.Revision()
			default:
				r.plainMessages.Add(1)
				delete(plain.live, e.Key())
				if rec, ok := RecordOfLease(e.Key()); ok {
					r.leasesEnded.Add(1)
					r.reap(ctx, rec, plain.live)
				}
			}
		}
	}
}

// scheduleLeases reports whether the bucket allows message schedules, so
// that its leases carry their expiry signal. It never changes the bucket
// (it belongs to the deployment, and a stream cannot turn schedules off
// again): a bucket without them is logged once per term, and the leader
// then reaps from every renewal; its sweeps read the bucket again.
func (r *Reaper) scheduleLeases(ctx context.Context, logOff bool) bool {
	cctx, cancel := context.WithTimeout(ctx, lockWriteTimeout)
	defer cancel()
	on, err := r.reg.readSchedules(cctx)
	switch {
	case err != nil && ctx.Err() == nil:
		r.errorsSeen.Add(1)
		r.log.Warn().Err(err).Msg("serverlist: reaper: read the registry bucket's configuration")
	case !on && logOff && r.reg.cfg.PlainLeases:
		// Asked for (a gateway with its embedded NATS server): said, not
		// warned, so that a newcomer's first run shows no warning.
		r.log.Info().Str("bucket", r.reg.cfg.Bucket).
			Msg("serverlist: reaper: leases are plain, as configured (PlainLeases), so the leading reaper receives every renewal (docs/protocol.md, \"The reaper by design\")")
	case !on && logOff:
		r.log.Warn().Str("bucket", r.reg.cfg.Bucket).
			Msg("serverlist: reaper: the registry bucket does not allow message schedules, so leases carry no expiry signal and the leading reaper receives every renewal (docs/protocol.md, \"The reaper by design\": how to allow them, and what it costs the NATS server)")
	}
	return on
}

// watchKeys starts a watch of the keys filter matches, with the entries
// held first; stop ends it and drains it.
func (r *Reaper) watchKeys(ctx context.Context, filter string) (w jetstream.KeyWatcher, stop func(), err error) {
	wctx, cancel := context.WithCancel(ctx)
	w, err = r.reg.kv.Watch(wctx, filter)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	return w, func() { stopWatcher(w); cancel() }, nil
}

// plainWatch is the watch of every lease write, with the leases it saw
// live (key -> revision). A nil *plainWatch is off: its updates channel is
// nil and stop does nothing.
type plainWatch struct {
	w    jetstream.KeyWatcher
	end  func()
	live map[string]uint64
}

func (r *Reaper) watchPlain(ctx context.Context) (*plainWatch, error) {
	w, stop, err := r.watchKeys(ctx, LeaseKeys)
	if err != nil {
		return nil, err
	}
	return &plainWatch{w: w, end: stop, live: make(map[string]uint64)}, nil
}

func (p *plainWatch) updates() <-chan jetstream.KeyValueEntry {
	if p == nil {
		return nil
	}
	return p.w.Updates()
}

func (p *plainWatch) stop() {
	if p != nil {
		p.end()
	}
}

// expire handles the expiry signal at revision sig of the record under
// key: the lease was not renewed for a whole lease before sig. Unless the
// lease was renewed after the signal, the reaper ends it (conditionally on
// its revision, so that a renewal racing the reaper wins), then removes the
// record if it was written before the signal (not a new holder's).
func (r *Reaper) expire(ctx context.Context, key string, sig uint64) {
	lease, err := r.reg.kv.Get(ctx, key+leaseSuffix)
	switch {
	case err == nil && lease.Revision() > sig:
		return // renewed after the signal
	case err == nil && r.leasePurgeRefused.Load():
		// May not end leases: the record goes alone (below). A holder
		// that renews late finds its record gone and re-asserts it.
	case err == nil:
		err = r.reg.kv.Purge(ctx, key+leaseSuffix, jetstream.LastRevision(lease.Revision()))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			return // renewed meanwhile
		}
		if err != nil && r.refusedOn(err, key+leaseSuffix) {
			r.leasePurgeRefused.Store(true)
			r.log.Warn().Err(err).Str("bucket", r.reg.cfg.Bucket).
				Msg("serverlist: reaper: this process may not end leases (purge <service>.<id>.lease, docs/security.md): it removes the records of ended leases alone, and their expiry signals repeat every lease until the leases are ended")
			err = nil
		}
	case errors.Is(err, jetstream.ErrKeyNotFound):
		err = nil // ended by its holder, or aged out
	}
	if err != nil {
		if ctx.Err() == nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Str("key", key).Msg("serverlist: reaper: end the lease")
		}
		return
	}
	rec, err := r.reg.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Withdrawn, or reaped already.
	case err != nil:
		if ctx.Err() == nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Str("key", key).Msg("serverlist: reaper: read the record")
		}
	case rec.Revision() < sig:
		r.remove(ctx, key, rec.Revision(), "lease ended")
	}
}

// reap removes the record under key unless its lease lives again (the
// plain path).
func (r *Reaper) reap(ctx context.Context, key string, live map[string]uint64) {
	if _, ok := live[key+leaseSuffix]; ok {
		return
	}
	e, err := r.reg.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return // withdrawn: the record went first
	}
	if err != nil {
		if ctx.Err() == nil { // not the reaper stopping
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Str("key", key).Msg("serverlist: reaper: read the record")
		}
		return
	}
	r.remove(ctx, key, e.Revision(), "lease ended")
}

// remove purges the record under key if it is still at rev.
func (r *Reaper) remove(ctx context.Context, key string, rev uint64, why string) {
	err := r.reg.kv.Purge(ctx, key, jetstream.LastRevision(rev))
	switch {
	case err == nil:
		r.reaped.Add(1)
		r.log.Info().Str("key", key).Uint64("revision", rev).Str("why", why).Msg("serverlist: reaper removed the record")
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		// Rewritten meanwhile (a new holder): not ours to remove.
	case ctx.Err() != nil:
		// The reaper is stopping.
	default:
		r.errorsSeen.Add(1)
		r.log.Warn().Err(err).Str("key", key).Msg("serverlist: reaper: remove the record")
	}
}

// sweep lists the leases and the records, and removes the records that had
// no lease at the previous sweep (prev) and still have none, unchanged. It
// returns the records without a lease now, and the number of live leases
// written without an expiry signal (-1 when the leases could not be
// listed).
func (r *Reaper) sweep(ctx context.Context, prev map[string]uint64) (next map[string]uint64, plain int) {
	r.sweeps.Add(1)
	if m := r.cfg.Mirror; m != nil && m.Synced() {
		return r.sweepMirrored(ctx, m, prev)
	}
	live, plain, err := r.listLeases(ctx, []string{r.reg.subject(LeaseKeys)})
	if err != nil {
		if ctx.Err() == nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Msg("serverlist: reaper: list the leases")
		}
		return prev, -1
	}
	lister, err := r.reg.kv.ListKeysFiltered(ctx, RecordKeys)
	if err != nil {
		if ctx.Err() == nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Msg("serverlist: reaper: list the records")
		}
		return prev, plain
	}
	var orphans []string
	for key := range lister.Keys() {
		if !live.holdsLeaseOf(key) {
			orphans = append(orphans, key)
		}
	}
	return r.sweepOrphans(ctx, orphans, prev), plain
}

// sweepBatch is how many services' leases one consumer of a mirrored
// sweep lists: the leader then holds at most their leases' messages
// queued at a time, where one consumer over every lease let tens of MB
// of them queue (docs/perf.md, "Cold start, third pass").
const sweepBatch = 50

// sweepMirrored is sweep with the records taken from m, a synced mirror
// of the bucket: its index and the records it leaves out (malformed or
// marked down). A record the mirror has not applied yet waits for the
// next sweep; the records found without a lease are read from the bucket
// before anything is removed, as in sweep.
func (r *Reaper) sweepMirrored(ctx context.Context, m *Mirror, prev map[string]uint64) (next map[string]uint64, plain int) {
	r.mirroredSweeps.Add(1)
	services := m.state.Load().services
	skipped := m.skippedKeys()
	names := make(map[string]struct{}, len(services)+len(skipped))
	for name := range services {
		names[name] = struct{}{}
	}
	for _, key := range skipped {
		if service, _, ok := strings.Cut(key, "."); ok && validateService(service) == nil {
			names[service] = struct{}{}
		}
	}
	filters := make([]string, 0, len(names))
	for _, name := range slices.Sorted(maps.Keys(names)) {
		filters = append(filters, r.reg.subject(name+".*"+leaseSuffix))
	}
	live := newLeaseSet()
	for batch := range slices.Chunk(filters, sweepBatch) {
		n, err := r.listLeasesInto(ctx, live, batch)
		if err != nil {
			if ctx.Err() == nil {
				r.errorsSeen.Add(1)
				r.log.Warn().Err(err).Msg("serverlist: reaper: list the leases")
			}
			return prev, -1
		}
		plain += n
	}
	// The records the index leaves out first; an indexed record that was
	// also among them (read while the mirror applied its change) is not
	// listed twice.
	var orphans []string
	unindexed := make(map[string]struct{}, len(skipped))
	for _, key := range skipped {
		unindexed[key] = struct{}{}
		if !live.holdsLeaseOf(key) {
			orphans = append(orphans, key)
		}
	}
	for name, svc := range services {
		for _, e := range *svc.ids.Load() {
			if live.holdsLeaseOfInstance(name, e.rec.id) {
				continue
			}
			if key, err := EncodeKey(name, e.rec.id); err == nil {
				if _, listed := unindexed[key]; !listed {
					orphans = append(orphans, key)
				}
			}
		}
	}
	return r.sweepOrphans(ctx, orphans, prev), plain
}

// sweepOrphans reads again the records found without a lease (orphans),
// removes those that had none at the previous sweep either (prev) at the
// same revision, and returns the others with their revisions.
func (r *Reaper) sweepOrphans(ctx context.Context, orphans []string, prev map[string]uint64) (next map[string]uint64) {
	next = make(map[string]uint64, len(orphans))
	for _, key := range orphans {
		e, err := r.reg.kv.Get(ctx, key)
		if err != nil {
			continue // gone meanwhile, or unreadable: the next sweep tells
		}
		if _, err := r.reg.kv.Get(ctx, key+leaseSuffix); err == nil {
			continue // a lease started since the listing
		}
		if prev[key] == e.Revision() {
			r.remove(ctx, key, e.Revision(), "no lease for a sweep interval")
			continue
		}
		next[key] = e.Revision()
	}
	return next
}

// listLeases returns the live lease keys of the lease subjects filters
// match, read from the last message of each (headers only, through an
// ordered push consumer, as a KV watch reads: the reaper's permissions are
// a watcher's), and how many of them carry no expiry signal.
func (r *Reaper) listLeases(ctx context.Context, filters []string) (leaseSet, int, error) {
	live := newLeaseSet()
	plain, err := r.listLeasesInto(ctx, live, filters)
	if err != nil {
		return leaseSet{}, 0, err
	}
	return live, plain, nil
}

// listLeasesInto is listLeases adding the keys to live.
func (r *Reaper) listLeasesInto(ctx context.Context, live leaseSet, filters []string) (int, error) {
	js, err := r.reg.js.Conn().JetStream()
	if err != nil {
		return 0, err
	}
	prefix := r.reg.subject("")
	var (
		mu                sync.Mutex // guards what the handler writes
		plain             int
		received, pending uint64
		done              = make(chan struct{})
		finished          bool
	)
	finish := func() { // with mu held
		if !finished {
			finished = true
			close(done)
		}
	}
	subject, opts := filters[0], []nats.SubOpt{nats.BindStream("KV_" + r.reg.cfg.Bucket), nats.OrderedConsumer(), nats.DeliverLastPerSubject(), nats.HeadersOnly(), nats.Context(ctx)}
	if len(filters) > 1 {
		subject, opts = "", append(opts, nats.ConsumerFilterSubjects(filters...))
	}
	mu.Lock()
	sub, err := js.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		md, err := m.Metadata()
		if finished || err != nil {
			return
		}
		if !isRemoval(m.Header) {
			live.add(m.Subject[len(prefix):])
			if m.Header.Get(headerSchedule) == "" {
				plain++
			}
		}
		if received++; received >= pending || md.NumPending == 0 {
			finish()
		}
	}, opts...)
	if err != nil {
		mu.Unlock()
		return 0, err
	}
	defer sub.Unsubscribe()
	pending, err = sub.InitialConsumerPending()
	if err != nil || pending == 0 {
		finish()
	}
	mu.Unlock()
	if err != nil {
		return 0, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	return plain, nil
}

// leaseSet is the set of live lease keys a sweep lists, held as keyed
// 64-bit hashes: at 100,000 leases some 2 MB instead of about 12 MB of
// key strings (each a slice of its message's subject, which it kept
// alive), at the leader's start, while the gateway's own load is under
// way. A collision (odds about n²/2^65: 3 x 10^-10 at 100,000 keys)
// makes an orphan record look leased for one sweep: the next sweep's set
// has a seed of its own.
type leaseSet struct {
	seed maphash.Seed
	sums map[uint64]struct{}
}

func newLeaseSet() leaseSet {
	return leaseSet{seed: maphash.MakeSeed(), sums: make(map[uint64]struct{})}
}

// add adds the lease key key.
func (s leaseSet) add(key string) { s.sums[maphash.String(s.seed, key)] = struct{}{} }

// holdsLeaseOf reports whether the set holds the lease key of the record
// key record (record + leaseSuffix), without building that string.
func (s leaseSet) holdsLeaseOf(record string) bool {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(record)
	h.WriteString(leaseSuffix)
	_, ok := s.sums[h.Sum64()]
	return ok
}

// holdsLeaseOfInstance is holdsLeaseOf for the record of service/id,
// without building its key: the ID is encoded on the stack.
func (s leaseSet) holdsLeaseOfInstance(service, id string) bool {
	var raw [events.MaxInstanceIDLength]byte
	var enc [maxEncodedID]byte
	n := copy(raw[:], id)
	keyEncoding.Encode(enc[:], raw[:n])
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(service)
	h.WriteByte('.')
	h.Write(enc[:keyEncoding.EncodedLen(n)])
	h.WriteString(leaseSuffix)
	_, ok := s.sums[h.Sum64()]
	return ok
}
