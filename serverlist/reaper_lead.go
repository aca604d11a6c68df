package serverlist

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/base/ctxutil"
)

// term is what a leading reaper holds for one lead: the lock's revision
// and the watches it reaps from.
type term struct {
	rev uint64 // the lock's revision, renewed at a third of the TTL
	// scheduled: the bucket allows message schedules, so the term consumes
	// the leases' expiry signals (expiries).
	scheduled    bool
	expiries     <-chan jetstream.KeyValueEntry // nil until watched
	stopExpiries func()
	plain        *plainWatch       // the watch of every lease write; nil while off
	candidates   map[string]uint64 // record key -> revision, without a lease at the last sweep
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
	t := &term{rev: rev, stopExpiries: func() {}, candidates: make(map[string]uint64)}
	defer r.endTerm(ctx, t)
	if !r.startWatches(ctx, t) {
		_ = ctxutil.Sleep(ctx, reaperRetry)
		return
	}
	if r.cfg.OnLead != nil {
		// The term's other duties (a Replicator): they end with the term,
		// which waits for them.
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.cfg.OnLead(tctx)
		}()
		defer func() { cancel(); <-done }()
	}

	ttl := r.reg.cfg.TTL
	renew := time.NewTicker(max(ttl/3, 100*time.Millisecond))
	defer renew.Stop()
	sweep := time.NewTimer(0) // the first sweep at once, the next after one TTL
	defer sweep.Stop()
	sweepEvery := ttl
	for {
		var goOn bool
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
			goOn = r.renewLock(ctx, t)
		case <-sweep.C:
			var plainLeases int
			t.candidates, plainLeases = r.sweep(ctx, t.candidates)
			sweep.Reset(sweepEvery)
			sweepEvery = r.cfg.SweepInterval
			goOn = r.adaptWatches(ctx, t, plainLeases)
		case e, ok := <-t.expiries:
			goOn = r.expirySignal(ctx, e, ok)
		case e, ok := <-t.plain.updates():
			goOn = r.plainLeaseWrite(ctx, t.plain, e, ok)
		}
		if !goOn {
			return
		}
	}
}

// endTerm stops the term's watches and, when the reaper stops, gives the
// lock up, so that another reaper leads at once.
func (r *Reaper) endTerm(ctx context.Context, t *term) {
	t.plain.stop()
	t.stopExpiries()
	r.leader.Store(false)
	if ctx.Err() != nil {
		gctx, cancel := context.WithTimeout(context.Background(), lockWriteTimeout)
		_ = r.reg.kv.Purge(gctx, ReaperLockKey, jetstream.LastRevision(t.rev))
		cancel()
	}
}

// startWatches starts the term's first watch: the expiry signals when the
// bucket schedules leases, every lease write otherwise. It reports whether
// the watch started.
func (r *Reaper) startWatches(ctx context.Context, t *term) bool {
	t.scheduled = r.scheduleLeases(ctx, true)
	if t.scheduled {
		return r.watchExpiries(ctx, t)
	}
	return r.watchPlainLeases(ctx, t)
}

// watchExpiries starts the term's watch of the lease expiry signals. It
// reports whether it started; a failure is counted and logged.
func (r *Reaper) watchExpiries(ctx context.Context, t *term) bool {
	w, stop, err := r.watchKeys(ctx, ExpiryKeys)
	if err != nil {
		r.errorsSeen.Add(1)
		r.log.Warn().Err(err).Msg("serverlist: reaper: watch the lease expiries")
		return false
	}
	t.stopExpiries, t.expiries = stop, w.Updates()
	return true
}

// watchPlainLeases starts the term's watch of every lease write. It
// reports whether it started; a failure is counted and logged.
func (r *Reaper) watchPlainLeases(ctx context.Context, t *term) bool {
	var err error
	if t.plain, err = r.watchPlain(ctx); err != nil {
		r.errorsSeen.Add(1)
		r.log.Warn().Err(err).Msg("serverlist: reaper: watch the leases")
		return false
	}
	return true
}

// renewLock renews the lock at the term's revision. It reports false when
// the lock was lost: the term ends.
func (r *Reaper) renewLock(ctx context.Context, t *term) bool {
	next, err := r.reg.kv.Update(ctx, ReaperLockKey, []byte(r.cfg.Node), t.rev)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn().Err(err).Msg("serverlist: reaper lost the lead")
		}
		return false
	}
	t.rev = next
	return true
}

// adaptWatches follows what a sweep found: once the bucket allows
// schedules, the term consumes the expiry signals; while plainLeases (the
// plain leases the sweep counted, -1 when it could not list them) remain,
// it also watches every lease write, and stops once they are gone. It
// reports false when a watch failed to start: the term ends.
func (r *Reaper) adaptWatches(ctx context.Context, t *term, plainLeases int) bool {
	if !t.scheduled && r.scheduleLeases(ctx, false) {
		// An operator allowed schedules: leases written from now on carry
		// their signal.
		if !r.watchExpiries(ctx, t) {
			return false
		}
		t.scheduled = true
		r.log.Info().Str("bucket", r.reg.cfg.Bucket).Msg("serverlist: reaper: the registry bucket allows message schedules now: consuming the lease expiry signals")
	}
	if !t.scheduled || (t.plain != nil) == (plainLeases > 0) || plainLeases < 0 {
		return true
	}
	if t.plain != nil {
		r.log.Info().Msg("serverlist: reaper: every lease is scheduled now; it no longer receives the renewals")
		t.plain.stop()
		t.plain = nil
		return true
	}
	r.log.Info().Int("plain_leases", plainLeases).
		Msg("serverlist: reaper: leases without an expiry signal found (publishers of an earlier release, or of another client): watching every lease write until they are gone, at the cost of receiving every renewal")
	return r.watchPlainLeases(ctx, t)
}

// expirySignal handles an entry of the expiry watch (ok false: the watch
// ended). It reports false when the term ends.
func (r *Reaper) expirySignal(ctx context.Context, e jetstream.KeyValueEntry, ok bool) bool {
	switch {
	case !ok:
		r.errorsSeen.Add(1)
		return false
	case e == nil, e.Operation() != jetstream.KeyValuePut:
		// The end of the expiries still held, or one aging out.
	default:
		if rec, ok := RecordOfExpiry(e.Key()); ok {
			r.leasesEnded.Add(1)
			r.expire(ctx, rec, e.Revision())
		}
	}
	return true
}

// plainLeaseWrite handles an entry of p, the watch of every lease write
// (ok false: the watch ended): a lease removed or aged out has its record
// reaped. It reports false when the term ends.
func (r *Reaper) plainLeaseWrite(ctx context.Context, p *plainWatch, e jetstream.KeyValueEntry, ok bool) bool {
	switch {
	case !ok:
		r.errorsSeen.Add(1)
		return false
	case e == nil:
	case e.Operation() == jetstream.KeyValuePut:
		r.plainMessages.Add(1)
		p.live[e.Key()] = e.Revision()
	default:
		r.plainMessages.Add(1)
		delete(p.live, e.Key())
		if rec, ok := RecordOfLease(e.Key()); ok {
			r.leasesEnded.Add(1)
			r.reap(ctx, rec, p.live)
		}
	}
	return true
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
			Msg("serverlist: reaper: leases are plain, as configured: the registry bucket has no message schedules (cheaper for an embedded NATS server), so leases carry no expiry signal and the leading reaper receives every renewal (docs/protocol.md, \"The reaper by design\")")
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
