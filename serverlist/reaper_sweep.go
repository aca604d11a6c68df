package serverlist

import (
	"context"
	"errors"
	"iter"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// expire handles the expiry signal at revision sig of the record under
// key: the lease was not renewed for a whole lease before sig. Unless the
// lease was renewed after the signal, the reaper ends it (conditionally on
// its revision, so that a renewal racing the reaper wins), then removes the
// record if it was written before the signal (not a new holder's).
func (r *Reaper) expire(ctx context.Context, key string, sig uint64) {
	renewed, err := r.endLease(ctx, key, func(lease jetstream.KeyValueEntry) bool { return lease.Revision() > sig })
	if err != nil {
		r.failed(ctx, err).Str("key", key).Msg("serverlist: reaper: end the lease")
		return
	}
	if renewed {
		return // after the signal, or while the reaper ended it
	}
	rec, err := r.reg.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// Withdrawn, or reaped already.
	case err != nil:
		r.failed(ctx, err).Str("key", key).Msg("serverlist: reaper: read the record")
	case rec.Revision() < sig:
		r.remove(ctx, key, rec.Revision(), "lease ended")
	}
}

// endLease ends the lease of the record under key, conditionally on its
// revision, so that a renewal racing the reaper wins: renewed reports
// that it was renewed meanwhile, or before, by renewedSince (a renewal
// after the proof the caller has of its end). An absent lease (ended by
// its holder, or aged out) counts as ended. A reaper whose account may
// not end leases (it learns it at the first refusal, and says so once)
// leaves them: the record goes alone, and a holder that renews late finds
// it gone and re-asserts it.
func (r *Reaper) endLease(ctx context.Context, key string, renewedSince func(jetstream.KeyValueEntry) bool) (renewed bool, err error) {
	lease, err := r.reg.kv.Get(ctx, key+leaseSuffix)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, err
	case renewedSince(lease):
		return true, nil
	case r.leasePurgeRefused.Load():
		return false, nil
	}
	err = r.reg.kv.Purge(ctx, key+leaseSuffix, jetstream.LastRevision(lease.Revision()))
	switch {
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		return true, nil
	case err != nil && r.refusedOn(err, key+leaseSuffix):
		if !r.leasePurgeRefused.Swap(true) {
			r.log.Warn().Err(err).Str("bucket", r.reg.cfg.Bucket).
				Msg("serverlist: reaper: this process may not end leases (purge <service>.<id>.lease, docs/security.md): it removes the records of ended leases alone, and their expiry signals repeat every lease until the leases are ended")
		}
		return false, nil
	}
	return false, err
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
		r.failed(ctx, err).Str("key", key).Msg("serverlist: reaper: read the record")
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
	default:
		r.failed(ctx, err).Str("key", key).Msg("serverlist: reaper: remove the record")
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
		r.failed(ctx, err).Msg("serverlist: reaper: list the leases")
		return prev, -1
	}
	lister, err := r.reg.kv.ListKeysFiltered(ctx, RecordKeys)
	if err != nil {
		r.failed(ctx, err).Msg("serverlist: reaper: list the records")
		return prev, plain
	}
	var orphans []string
	for key := range lister.Keys() {
		if !IsRegionalKey(key) && !live.holdsLeaseOf(key) {
			orphans = append(orphans, key)
		}
	}
	return r.sweepOrphans(ctx, orphans, prev), plain
}

// sweepBatch is how many services' leases one consumer of a mirrored
// sweep lists: the leader then holds at most their leases' messages
// queued at a time, where one consumer over every lease let tens of MB
// of them queue (docs/perf/memory.md, "What keeps it down").
const sweepBatch = 50

// sweepBatchLeases bounds the mirrored instances (and records the mirror
// leaves out) of one batch of a mirrored sweep: the services of a batch
// are added until the next one would take it past this many, and a
// service larger than that is a batch alone. A batch's leases are listed
// into a set of their own, its records are checked against it, and the
// set goes before the next batch is listed: a sweep holds one batch's
// set and queued messages, not the fleet's. At 100,000 instances one set
// for the fleet (1.1 MB of hashes and the garbage of its growth) and the
// messages queued by a consumer of 50 services (some 5,000, 2.5 MB)
// were live during every sweep, and the GC's pacer (GOGC=100) turned
// that transient into twice its size of resident memory. A lease's
// message takes some 1.8 KB in the client (its headers as a map): 1,000
// of them still showed in the marked heap (0.5–1 MB against 250); 400
// consumers a sweep of 100,000 instances, one every 5 minutes, cost the
// server little.
const sweepBatchLeases = 250

// testHookSweepBatch, when set (by tests only), is called for each batch
// of a mirrored sweep with its services and the set of its leases, once
// they are listed and before its records are checked.
var testHookSweepBatch func(services []string, live leaseSet)

// sweepMirrored is sweep with the records taken from m, a synced mirror
// of the bucket: its index and the records it leaves out (malformed or
// marked down). A record the mirror has not applied yet waits for the
// next sweep; the records found without a lease are read from the bucket
// before anything is removed, as in sweep. The services are swept in
// batches (sweepBatches), each against the set of its own leases.
func (r *Reaper) sweepMirrored(ctx context.Context, m *Mirror, prev map[string]uint64) (next map[string]uint64, plain int) {
	r.mirroredSweeps.Add(1)
	services := m.state.Load().services
	// The records the index leaves out, by service. An indexed record
	// that is also among them (read while the mirror applied its change)
	// is checked once, as one of them (unindexed). A key without a valid
	// service is under none of the subjects a batch lists: no lease of it
	// is ever found.
	skipped := m.skippedKeys()
	unindexed := make(map[string]struct{}, len(skipped))
	skippedOf := make(map[string][]string)
	var orphans []string
	for _, key := range skipped {
		unindexed[key] = struct{}{}
		if service, _, ok := strings.Cut(key, "."); ok && validateService(service) == nil {
			skippedOf[service] = append(skippedOf[service], key)
		} else if !IsRegionalKey(key) {
			orphans = append(orphans, key) // no lease of it is listed
		}
	}
	filters := make([]string, 0, sweepBatch)
	for batch, leases := range sweepBatches(services, skippedOf) {
		filters = filters[:0]
		for _, name := range batch {
			filters = append(filters, r.reg.subject(name+".*"+leaseSuffix))
		}
		live := newLeaseSetFor(leases)
		n, err := r.listLeasesInto(ctx, live, filters)
		if err != nil {
			r.failed(ctx, err).Msg("serverlist: reaper: list the leases")
			return prev, -1
		}
		plain += n
		if testHookSweepBatch != nil {
			testHookSweepBatch(batch, live)
		}
		for _, name := range batch {
			for _, key := range skippedOf[name] {
				if !IsRegionalKey(key) && !live.holdsLeaseOf(key) {
					orphans = append(orphans, key)
				}
			}
			svc := services[name]
			if svc == nil {
				continue // only records the index leaves out
			}
			for _, e := range *svc.ids.Load() {
				if e.rec.regional() || live.holdsLeaseOfInstance(name, e.rec.srv.ID) {
					continue
				}
				if key, err := EncodeKey(name, e.rec.srv.ID); err == nil {
					if _, listed := unindexed[key]; !listed {
						orphans = append(orphans, key)
					}
				}
			}
		}
	}
	return r.sweepOrphans(ctx, orphans, prev), plain
}

// sweepBatches yields the batches of a mirrored sweep: the services of
// the mirror (services) and of the records it leaves out (skippedOf), in
// order, grouped while a group holds at most sweepBatch services and
// sweepBatchLeases records (the mirror's instances of its services and
// the records left out), a larger service alone; with each, its count of
// records. A batch is reused for the next one: the caller keeps none.
func sweepBatches(services map[string]*mirrorService, skippedOf map[string][]string) iter.Seq2[[]string, int] {
	return func(yield func([]string, int) bool) {
		names := make([]string, 0, len(services)+len(skippedOf))
		for name := range services {
			names = append(names, name)
		}
		for name := range skippedOf {
			if _, indexed := services[name]; !indexed {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		batch := make([]string, 0, sweepBatch)
		leases := 0
		for _, name := range names {
			n := len(skippedOf[name])
			if svc := services[name]; svc != nil {
				n += len(*svc.ids.Load())
			}
			if len(batch) > 0 && (len(batch) == sweepBatch || leases+n > sweepBatchLeases) {
				if !yield(batch, leases) {
					return
				}
				batch, leases = batch[:0], 0
			}
			batch = append(batch, name)
			leases += n
		}
		if len(batch) > 0 {
			yield(batch, leases)
		}
	}
}

// sweepOrphans reads again the records found without a lease (orphans),
// removes those that had none at the previous sweep either (prev) at the
// same revision, and returns the others with their revisions. Another
// region's copies (IsRegionalKey) have no lease here and are never
// orphans: the callers leave them out.
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
