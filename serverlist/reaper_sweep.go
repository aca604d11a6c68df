package serverlist

import (
	"context"
	"errors"
	"maps"
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
			r.failed(ctx, err).Msg("serverlist: reaper: list the leases")
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
		if !IsRegionalKey(key) && !live.holdsLeaseOf(key) {
			orphans = append(orphans, key)
		}
	}
	for name, svc := range services {
		for _, e := range *svc.ids.Load() {
			if e.rec.regional || live.holdsLeaseOfInstance(name, e.rec.srv.ID) {
				continue
			}
			if key, err := EncodeKey(name, e.rec.srv.ID); err == nil {
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
