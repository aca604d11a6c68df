package serverlist

// Replication between regions (docs/multiregion.md). Each region's
// registry is its own bucket on its own NATS cluster; a Replicator, run
// by one process of a region at a time (the reaper's leader), copies the
// records of the other regions' buckets into its region's bucket, under
// regional keys (EncodeRegionalKey), read-only: they carry their region
// and a qualified ID (QualifiedID), no lease, no NATS connection and no
// gossip node, so that nothing of this region renews, reaps or probes
// them. A region's own writes never wait on another region: the copies
// are written by this region's replicator, after the other region's write.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/base/ctxutil"
)

// RemoteRegion is another region whose registry a [Replicator] copies.
type RemoteRegion struct {
	// Name is the region's name (ValidateRegion), which its copies carry.
	Name string `json:"name" yaml:"name"`
	// Domain is the JetStream domain of its NATS servers, through which
	// its bucket is read (leaf nodes: a domain per region). Empty: the
	// local connection's JetStream (a supercluster: one domain, a bucket
	// per region).
	Domain string `json:"domain,omitempty" yaml:"domain"`
	// Bucket is its registry bucket. Empty: the local bucket's name.
	Bucket string `json:"bucket,omitempty" yaml:"bucket"`
}

// ReplicatorConfig configures a [Replicator].
type ReplicatorConfig struct {
	// Region is this registry's region (required). Copies of it are never
	// made: a remote of this name is an error.
	Region string
	// Remotes are the regions whose records are copied.
	Remotes []RemoteRegion
	// Probe is how often the link to each remote region is probed (a
	// request for its bucket's state); two probes in a row without an
	// answer mark the region cut, and the first answer after that copies
	// the region again from its bucket. Zero means DefaultReplicaProbe.
	Probe time.Duration
	// StatusInterval is how often the region's status key is written
	// again while nothing changes, so that readers tell a replicator that
	// stopped from a quiet link (RegionStatus.Stale). Zero means
	// DefaultRegionStatusInterval.
	StatusInterval time.Duration
	// Logger receives links cut and back, and failures.
	Logger zerolog.Logger
}

const (
	// DefaultReplicaProbe is ReplicatorConfig.Probe's default.
	DefaultReplicaProbe = 250 * time.Millisecond
	// DefaultRegionStatusInterval is ReplicatorConfig.StatusInterval's
	// default.
	DefaultRegionStatusInterval = 5 * time.Second
	// RegionStatusKeys is the key filter of the regions' status keys
	// (RegionStatus), one per remote region: "_pushlb.region.<name>".
	RegionStatusKeys = regionStatusPrefix + "*"

	regionStatusPrefix = "_pushlb.region."
)

// Validate checks the configuration: a valid own region, valid and
// distinct remote names other than it.
func (c ReplicatorConfig) Validate() error {
	if err := ValidateRegion(c.Region); err != nil {
		return fmt.Errorf("%w: replication needs this registry's region: %w", ErrInvalidConfig, err)
	}
	seen := map[string]bool{}
	for _, rem := range c.Remotes {
		if err := ValidateRegion(rem.Name); err != nil {
			return fmt.Errorf("%w: remote region: %w", ErrInvalidConfig, err)
		}
		if rem.Name == c.Region {
			return fmt.Errorf("%w: remote region %q is this registry's own", ErrInvalidConfig, rem.Name)
		}
		if seen[rem.Name] {
			return fmt.Errorf("%w: remote region %q given twice", ErrInvalidConfig, rem.Name)
		}
		seen[rem.Name] = true
	}
	return nil
}

// Replicator copies other regions' records into a registry. Run it in
// one process of the region at a time: [Replicator.Lead] during the
// reaper's leadership (ReaperConfig.OnLead). Its methods are safe for
// concurrent use.
type Replicator struct {
	reg  *Registry
	cfg  ReplicatorConfig
	log  zerolog.Logger
	node string

	seed    maphash.Seed
	remotes []*remoteState

	forgotten atomic.Uint64
	leading   atomic.Bool
	// stopping counts the stopped watches of cut regions whose consumers
	// are still being deleted (stopWatcherAsync); Lead waits for them.
	stopping sync.WaitGroup
}

// remoteState is one remote region's counters and link state.
type remoteState struct {
	RemoteRegion
	linked                                atomic.Bool
	copies                                atomic.Int64
	written, removed, resyncs, cuts, errs atomic.Uint64
	skipped                               atomic.Uint64
}

// ReplicaStats is what a Replicator did for one remote region.
type ReplicaStats struct {
	Region string `json:"region"`
	// Linked reports whether its bucket answers (as this process last
	// saw it while leading).
	Linked bool `json:"linked"`
	// Copies is how many of its records this registry holds.
	Copies int64 `json:"copies"`
	// Written and Removed count copies written and removed; Resyncs the
	// times the region was read whole (each term, each heal); Cuts the
	// times its link was found cut; Skipped its records that could not be
	// copied (an ID too long once qualified, a malformed record); Errors
	// failed reads and writes.
	Written uint64 `json:"written"`
	Removed uint64 `json:"removed"`
	Resyncs uint64 `json:"resyncs"`
	Cuts    uint64 `json:"cuts"`
	Skipped uint64 `json:"skipped"`
	Errors  uint64 `json:"errors"`
}

// ReplicatorStats is a Replicator's state.
type ReplicatorStats struct {
	// Leading reports whether it replicates now.
	Leading bool `json:"leading"`
	// Forgotten counts the copies of regions no longer configured that it
	// removed.
	Forgotten uint64         `json:"forgotten"`
	Remotes   []ReplicaStats `json:"remotes"`
}

// NewReplicator returns a Replicator into reg's bucket. It starts nothing.
func NewReplicator(reg *Registry, cfg ReplicatorConfig) (*Replicator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Probe <= 0 {
		cfg.Probe = DefaultReplicaProbe
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultRegionStatusInterval
	}
	r := &Replicator{reg: reg, cfg: cfg, log: cfg.Logger, seed: maphash.MakeSeed(), node: defaultNode()}
	for _, rem := range cfg.Remotes {
		if rem.Bucket == "" {
			rem.Bucket = reg.cfg.Bucket
		}
		r.remotes = append(r.remotes, &remoteState{RemoteRegion: rem})
	}
	return r, nil
}

// Stats reports what the Replicator did, per remote region in the
// configured order.
func (r *Replicator) Stats() ReplicatorStats {
	st := ReplicatorStats{Leading: r.leading.Load(), Forgotten: r.forgotten.Load()}
	for _, rs := range r.remotes {
		st.Remotes = append(st.Remotes, ReplicaStats{
			Region: rs.Name, Linked: rs.linked.Load(), Copies: rs.copies.Load(),
			Written: rs.written.Load(), Removed: rs.removed.Load(), Resyncs: rs.resyncs.Load(),
			Cuts: rs.cuts.Load(), Skipped: rs.skipped.Load(), Errors: rs.errs.Load(),
		})
	}
	return st
}

// Lead replicates until ctx ends: it reads the copies the bucket holds,
// removes those of regions no longer configured, and follows each remote
// region in a goroutine of its own, which it waits for before it returns.
func (r *Replicator) Lead(ctx context.Context) {
	r.leading.Store(true)
	defer r.leading.Store(false)
	var held map[string]map[string]copyState
	for {
		var err error
		if held, err = r.heldCopies(ctx); err == nil {
			break
		}
		r.log.Warn().Err(err).Msg("serverlist: replication: read the copies this registry holds")
		if ctxutil.Sleep(ctx, time.Second) != nil {
			return
		}
	}
	r.forget(ctx, held)
	var wg sync.WaitGroup
	for _, rs := range r.remotes {
		js, err := remoteJetStream(r.reg.js.Conn(), rs.RemoteRegion)
		if err != nil {
			// Only an invalid domain, which nats.go refuses: this region
			// is never copied.
			r.log.Error().Err(err).Str("region", rs.Name).Msg("serverlist: replication: the region's JetStream")
			continue
		}
		f := &follower{r: r, rs: rs, js: js, held: held[rs.Name], statusSignal: make(chan struct{}, 1)}
		if f.held == nil {
			f.held = map[string]copyState{}
		}
		var n int64
		for _, cs := range f.held {
			if cs.sum != 0 {
				n++
			}
		}
		rs.copies.Store(n)
		wg.Go(func() { f.run(ctx) })
	}
	wg.Wait()
	r.stopping.Wait()
}

// copyState is what the bucket holds under a copy's key: the revision of
// its last message (a copy or a removal marker) and the sum of the copy
// (zero for a marker).
type copyState struct {
	rev uint64
	sum uint64
}

// heldCopies reads the copies the bucket holds, by region.
func (r *Replicator) heldCopies(ctx context.Context) (map[string]map[string]copyState, error) {
	w, err := r.reg.watchBounded(ctx, RecordKeys)
	if err != nil {
		return nil, err
	}
	defer stopWatcher(w)
	held := map[string]map[string]copyState{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("the watch ended")
			}
			if e == nil {
				return held, nil
			}
			key := e.Key()
			if !IsRegionalKey(key) {
				continue
			}
			region := key[strings.LastIndex(key, regionSeparator)+1:]
			if held[region] == nil {
				held[region] = map[string]copyState{}
			}
			cs := copyState{rev: e.Revision()}
			if e.Operation() == jetstream.KeyValuePut {
				cs.sum = maphash.Bytes(r.seed, e.Value())
			}
			held[region][strings.Clone(key)] = cs
		}
	}
}

// forget removes the copies of regions not configured (a region removed
// from the configuration) and their status keys.
func (r *Replicator) forget(ctx context.Context, held map[string]map[string]copyState) {
	for region, copies := range held {
		if slices.ContainsFunc(r.remotes, func(rs *remoteState) bool { return rs.Name == region }) {
			continue
		}
		n := 0
		for key, cs := range copies {
			if cs.sum == 0 {
				continue
			}
			if _, err := r.writeMarker(ctx, key, cs.rev); err == nil {
				n++
			}
		}
		_ = r.reg.kv.Purge(ctx, regionStatusPrefix+region)
		r.forgotten.Add(uint64(n))
		r.log.Info().Str("region", region).Int("copies", n).
			Msg("serverlist: replication: removed the copies of a region no longer configured")
	}
}

// follower copies one remote region while its Replicator leads.
type follower struct {
	r    *Replicator
	rs   *remoteState
	js   jetstream.JetStream  // the region's (remoteJetStream)
	held map[string]copyState // by key: what this bucket holds of the region
	// status is the status statusLoop wrote last; nil before its first
	// write, which reads the one a previous leader wrote.
	status *RegionStatus
	// statusSignal has statusLoop write the status at once.
	statusSignal chan struct{}
}

// errCut ends a session whose link stopped answering.
var errCut = errors.New("the region's bucket does not answer")

// run follows the region until ctx ends: a session from a whole read of
// its bucket to a cut, then probes until it answers again. A session that
// fails before its first sync for a reason that lasts (the bucket answers
// its state but cannot be watched: a permission) is tried again after a
// backoff that doubles up to maxSessionBackoff. A failure is logged at
// warn once until the next sync.
func (f *follower) run(ctx context.Context) {
	rs := f.rs
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { f.statusLoop(ctx) })
	failed := 0     // sessions in a row that never synced and did not end transiently
	warned := false // since the last sync
	for ctx.Err() == nil {
		synced, err := f.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if rs.linked.Swap(false) || errors.Is(err, errCut) {
			rs.cuts.Add(1)
		}
		if synced {
			warned = false
		}
		switch {
		case synced, transient(err):
			// A cut, or a JetStream that will answer again (a
			// supercluster's meta group electing after a heal):
			// probed again at once.
			failed = 0
		default:
			failed++
		}
		log := f.r.log.Debug()
		if !warned {
			log, warned = f.r.log.Warn(), true
		}
		log.Err(err).Str("region", rs.Name).
			Msg("serverlist: replication: the region's registry does not answer; its copies are kept, marked stale, until it does")
		f.statusChanged()
		var wait time.Duration
		if failed > 1 {
			wait = min(time.Second<<min(failed-2, 6), maxSessionBackoff)
		}
		f.awaitAnswer(ctx, time.Now().Add(wait))
	}
}

// statusLoop writes the region's status when it changes (statusChanged)
// and every StatusInterval, until ctx ends: apart from the copies, so
// that a write of the status never delays one of a copy.
func (f *follower) statusLoop(ctx context.Context) {
	tick := time.NewTicker(f.r.cfg.StatusInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.statusSignal:
		}
		f.writeStatus(ctx, f.rs.linked.Load())
	}
}

// statusChanged has statusLoop write the status now.
func (f *follower) statusChanged() {
	select {
	case f.statusSignal <- struct{}{}:
	default:
	}
}

// transient reports whether err, the end of a session, says the region
// did not answer or its JetStream could not serve for now, rather than
// that its bucket cannot be watched.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, errCut) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeClusterNotAvailable
}

// jsErrCodeClusterNotAvailable is JetStream's "JetStream system
// temporarily unavailable" (its meta group has no leader).
const jsErrCodeClusterNotAvailable jetstream.ErrorCode = 10008

// maxSessionBackoff bounds the wait between sessions that fail before
// their first sync.
const maxSessionBackoff = 30 * time.Second

// awaitAnswer probes the region, from notBefore on, until its bucket
// answers or ctx ends.
func (f *follower) awaitAnswer(ctx context.Context, notBefore time.Time) {
	probe := time.NewTicker(f.r.cfg.Probe)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-probe.C:
			if !now.Before(notBefore) && f.answers(ctx) {
				return
			}
		}
	}
}

// bucket returns the region's bucket: a request for its stream's state,
// which also tells whether the region answers.
func (f *follower) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, f.probeTimeout())
	defer cancel()
	return f.js.KeyValue(ctx, f.rs.Bucket)
}

// remoteJetStream is the JetStream of the region rem over nc: through its
// domain, or this connection's own without one.
func remoteJetStream(nc *nats.Conn, rem RemoteRegion) (jetstream.JetStream, error) {
	if rem.Domain != "" {
		return jetstream.NewWithDomain(nc, rem.Domain)
	}
	return jetstream.New(nc)
}

// probeTimeout is how long a probe waits for the region's answer.
func (f *follower) probeTimeout() time.Duration { return max(2*f.r.cfg.Probe, 500*time.Millisecond) }

// answers reports whether the region's bucket answers a request for its
// state.
func (f *follower) answers(ctx context.Context) bool {
	_, err := f.bucket(ctx)
	return err == nil
}

// session reads the region's bucket whole, makes this bucket's copies
// equal to it, then applies its changes as they come, until ctx ends or
// two probes in a row go unanswered. synced reports whether it got as far
// as the whole read. The probes run in a goroutine of their own, so that
// one waiting for its answer never delays a copy.
func (f *follower) session(ctx context.Context) (synced bool, err error) {
	rs := f.rs
	kv, err := f.bucket(ctx)
	if err != nil {
		return false, fmt.Errorf("open %s's bucket %s: %w", rs.Name, rs.Bucket, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A bounded watch (kvwatch.go): KeyValue.Watch's push consumer let
	// the region's server send up to 32 MiB ahead of the copies written.
	w, err := watchBucket(sctx, f.js, rs.Bucket, RecordKeys)
	if err != nil {
		return false, fmt.Errorf("watch %s's bucket %s: %w", rs.Name, rs.Bucket, err)
	}
	// A cut region's server does not answer the deletion of the watch's
	// consumer: do not wait for it (Lead does, as it ends).
	defer stopWatcherAsync(w, &f.r.stopping)
	rs.resyncs.Add(1)
	cut := make(chan struct{})
	var probing sync.WaitGroup
	defer probing.Wait()
	defer cancel() // before the wait: it ends the probes
	probing.Go(func() { f.probeUntilCut(sctx, kv, cut) })
	seen := map[string]struct{}{} // the region's keys read before the catch-up
	for {
		select {
		case <-ctx.Done():
			return synced, ctx.Err()
		case <-cut:
			return synced, errCut
		case e, ok := <-w.Updates():
			if !ok {
				return synced, errors.New("the watch ended")
			}
			if e == nil {
				if !synced {
					synced = true
					f.removeUnseen(ctx, seen)
					seen = nil
					rs.linked.Store(true)
					f.statusChanged()
					f.r.log.Info().Str("region", rs.Name).Int64("copies", rs.copies.Load()).
						Msg("serverlist: replication: the region's records copied")
				}
				continue
			}
			key, ok := f.copyEntry(ctx, e)
			if ok && !synced {
				seen[key] = struct{}{}
			}
		}
	}
}

// probeUntilCut probes the region's bucket every Probe until ctx ends, or
// until two probes in a row go unanswered: it then closes cut.
func (f *follower) probeUntilCut(ctx context.Context, kv jetstream.KeyValue, cut chan<- struct{}) {
	tick := time.NewTicker(f.r.cfg.Probe)
	defer tick.Stop()
	unanswered := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, f.probeTimeout())
		_, err := kv.Status(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			unanswered = 0
		default:
			if unanswered++; unanswered >= 2 {
				close(cut)
				return
			}
		}
	}
}

// copyEntry applies one entry of the region's bucket to this bucket and
// returns the copy's key; ok is false for an entry that names no record
// of the region itself (its lease, its own copies of other regions, a
// malformed key).
func (f *follower) copyEntry(ctx context.Context, e jetstream.KeyValueEntry) (key string, ok bool) {
	rs := f.rs
	if IsRegionalKey(e.Key()) {
		return "", false // the region's copies of others: each region copies its own
	}
	service, id, err := DecodeKey(e.Key())
	if err != nil {
		return "", false
	}
	if key, err = EncodeRegionalKey(service, rs.Name, id); err != nil {
		rs.skipped.Add(1)
		return "", false
	}
	if e.Operation() != jetstream.KeyValuePut {
		f.remove(ctx, key)
		return key, true
	}
	val, err := f.copyOf(service, id, e.Value())
	if err != nil {
		rs.skipped.Add(1)
		f.r.log.Debug().Err(err).Str("region", rs.Name).Str("key", e.Key()).Msg("serverlist: replication: record not copied")
		f.remove(ctx, key) // an earlier good copy is not this record any more
		return key, true
	}
	if val == nil {
		f.remove(ctx, key) // marked down: as absent
		return key, true
	}
	f.put(ctx, key, val)
	return key, true
}

// copyOf returns the bytes of the copy of the region's record of
// service/id: its ID qualified, its region set, its NATS connection and
// gossip node left out. nil for a record marked down.
func (f *follower) copyOf(service, id string, value []byte) ([]byte, error) {
	in, err := decodeValue(service, id, value)
	if err != nil {
		return nil, err
	}
	if !in.Routable() {
		return nil, nil
	}
	in.InstanceID = QualifiedID(id, f.rs.Name)
	in.Region = f.rs.Name
	in.NATSServerID, in.NATSClientID = "", 0
	in.GossipNode, in.GossipAddr = "", ""
	if err := in.Validate(); err != nil {
		return nil, err
	}
	val, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	if len(val) > MaxValueSize {
		return nil, fmt.Errorf("%w: the copy of %s/%s is %d bytes, limit %d", ErrInvalidInstance, service, id, len(val), MaxValueSize)
	}
	return val, nil
}

// put writes the copy unless the bucket holds these bytes already.
func (f *follower) put(ctx context.Context, key string, val []byte) {
	sum := maphash.Bytes(f.r.seed, val)
	cs, had := f.held[key]
	if had && cs.sum == sum {
		return
	}
	rev, err := f.write(ctx, key, cs.rev, func(expect uint64) (uint64, error) {
		return f.r.reg.writePersistent(ctx, key, val, expect)
	})
	if err != nil {
		f.failed(err, key, "write")
		return
	}
	if !had || cs.sum == 0 {
		f.rs.copies.Add(1)
	}
	f.held[key] = copyState{rev: rev, sum: sum}
	f.rs.written.Add(1)
}

// remove removes the copy if the bucket holds it.
func (f *follower) remove(ctx context.Context, key string) {
	cs, had := f.held[key]
	if !had || cs.sum == 0 {
		return
	}
	rev, err := f.write(ctx, key, cs.rev, func(expect uint64) (uint64, error) {
		return f.r.writeMarker(ctx, key, expect)
	})
	if err != nil {
		f.failed(err, key, "remove")
		return
	}
	f.held[key] = copyState{rev: rev}
	f.rs.copies.Add(-1)
	f.rs.removed.Add(1)
}

// removeUnseen removes the copies of records the region's bucket no
// longer holds (seen: those it does).
func (f *follower) removeUnseen(ctx context.Context, seen map[string]struct{}) {
	for _, key := range slices.Sorted(maps.Keys(f.held)) {
		if _, ok := seen[key]; !ok {
			f.remove(ctx, key)
		}
	}
}

// write makes a conditional write at the revision the follower knows
// (expect), and once more at the subject's last revision when that was not
// it (a marker aged out, another leader's write during a hand-over).
func (f *follower) write(ctx context.Context, key string, expect uint64, do func(expect uint64) (uint64, error)) (uint64, error) {
	rev, err := do(expect)
	if !errors.Is(err, ErrRevisionMismatch) {
		return rev, err
	}
	last, err := f.r.reg.lastRevision(ctx, key)
	if err != nil {
		return 0, err
	}
	return do(last)
}

// failed counts and logs a failed write of a copy.
func (f *follower) failed(err error, key, what string) {
	f.rs.errs.Add(1)
	f.r.log.Warn().Err(err).Str("region", f.rs.Name).Str("key", key).Msg("serverlist: replication: " + what + " a copy")
}

// writeMarker removes key with a purge marker, conditionally on its last
// revision being expect, and returns the marker's revision.
func (r *Replicator) writeMarker(ctx context.Context, key string, expect uint64) (uint64, error) {
	m := nats.NewMsg(r.reg.subject(key))
	m.Header.Set("KV-Operation", "PURGE")
	m.Header.Set("Nats-Rollup", "sub")
	m.Header.Set(headerExpectLast, fmt.Sprint(expect))
	ack, err := r.reg.js.PublishMsg(ctx, m)
	if wrongLastSequence(err) {
		return 0, fmt.Errorf("%w: %s is no longer at revision %d", ErrRevisionMismatch, key, expect)
	}
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// lastRevision is the revision of key's last message, 0 for none.
func (r *Registry) lastRevision(ctx context.Context, key string) (uint64, error) {
	m, err := r.lastMessage(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return m.Sequence, nil
}

// writeStatus writes the region's status (linked or cut), keeping its
// Since while the state stays. Only statusLoop calls it.
func (f *follower) writeStatus(ctx context.Context, linked bool) {
	now := time.Now().UTC()
	st := RegionStatus{Region: f.rs.Name, Linked: linked, Since: now, Written: now, Node: f.r.node, Copies: f.rs.copies.Load()}
	key := regionStatusPrefix + f.rs.Name
	if f.status == nil {
		// A previous leader's, read once per term.
		f.status = &RegionStatus{}
		if e, err := f.r.reg.kv.Get(ctx, key); err == nil {
			_ = json.Unmarshal(e.Value(), f.status)
		}
	}
	if old := f.status; old.Linked == linked && !old.Since.IsZero() {
		st.Since = old.Since
	}
	*f.status = st
	val, err := json.Marshal(st)
	if err != nil {
		return
	}
	m := nats.NewMsg(f.r.reg.subject(key))
	m.Data = val
	m.Header.Set(headerTTL, "never")
	if _, err := f.r.reg.js.PublishMsg(ctx, m); err != nil && ctx.Err() == nil {
		f.rs.errs.Add(1)
		f.r.log.Warn().Err(err).Str("region", f.rs.Name).Msg("serverlist: replication: write the region's status")
	}
}
