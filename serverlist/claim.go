package serverlist

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
)

// ClaimOptions tune [Registry.Claim].
type ClaimOptions struct {
	// Replace takes the ID over at once even when another live process
	// holds it. That process finds its record overwritten by a newer
	// incarnation and yields (see [Superseded]).
	Replace bool
	// Probe is how long Claim watches a record held by another owner for a
	// sign of life (a refresh) before it presumes the holder dead and takes
	// the ID over. Zero means half the bucket's TTL: a holder refreshes at a
	// third of it. It bounds how long a restart after a crash waits while
	// the crashed process's record has not expired yet.
	Probe time.Duration
	// OnProbe, when set, is called (on the caller's goroutine) as Claim
	// starts watching another owner's record, with that record and how long
	// it may watch: the wait of a restart after a crash, told instead of
	// silent. ctx still bounds the wait. It is not called when HolderAnswers
	// refused the claim first.
	OnProbe func(held Instance, probe time.Duration)
	// HolderAnswers, when set, is asked once, on the caller's goroutine, as
	// Claim starts watching a record held by another owner: does the
	// record's holder answer? true means a live process holds the ID, and
	// Claim fails at once with an error wrapping ErrInUse, writing nothing,
	// instead of waiting for a renewal that may be up to a third of the TTL
	// away. false proves nothing (nothing answered, or the caller cannot
	// tell, such as when the address to ask is its own): Claim watches the
	// record as it would without the hook. The watch runs meanwhile, so a
	// renewal during the call is not missed; ctx, which the call must
	// respect, ends with the watch (Probe). Claim does no network probing
	// of its own: what to ask and how is the caller's (publisher.Publisher
	// connects to the holder's gossip node or service address).
	HolderAnswers func(ctx context.Context, held Instance) bool
}

// ClaimWait is how long [Registry.Claim] with opts watches a record held
// by another owner at most before it presumes the holder dead: opts.Probe,
// or half the bucket's TTL. A caller that bounds Claim with a timeout
// allows this on top of the time of its network operations, or it cuts
// the wait of a restart after a crash short.
func (r *Registry) ClaimWait(opts ClaimOptions) time.Duration {
	if opts.Probe > 0 {
		return opts.Probe
	}
	return r.cfg.TTL / 2
}

// Claim registers in as the one live process of its instance ID: the
// identity rule of the wire protocol (docs/protocol.md, "Identity"). in.Owner
// must name the caller's process.
//
//   - A key with no live entry (never written, deregistered, expired) is
//     created with a create-only write.
//   - A record of the same owner (a re-announcement) is updated in place.
//   - A record of another owner is taken over at once with opts.Replace.
//     Otherwise Claim watches it for opts.Probe: if opts.HolderAnswers says
//     its holder answers, or the holder refreshes it meanwhile, the holder
//     is alive and Claim fails with an error wrapping ErrInUse, writing
//     nothing; if the record goes away, Claim creates it; if nothing
//     happens, or the lease ends, the holder is presumed dead (a crash whose
//     lease has not run out yet) and Claim takes the record over.
//
// Every write is conditional on the revision Claim read, so two claimants
// never both win. The record is written to never age out, and Claim then
// starts the instance's lease ([Registry.PutLease]), which the caller
// renews ([Registry.RefreshLease]) and whose end makes a [Reaper] remove
// the record. It returns the revisions of the record and of the lease; an
// error after the record was written leaves Claimed.Lease zero.
func (r *Registry) Claim(ctx context.Context, in Instance, opts ClaimOptions) (Claimed, error) {
	if in.Owner == "" {
		return Claimed{}, fmt.Errorf("%w: Claim needs an owner", ErrInvalidInstance)
	}
	if _, _, err := encodeInstance(in); err != nil {
		return Claimed{}, err
	}
	rev, err := r.claimRecord(ctx, in, opts)
	if err != nil {
		return Claimed{}, err
	}
	lease, err := r.PutLease(ctx, in.Service, in.InstanceID, in.Owner)
	return Claimed{Record: rev, Lease: lease}, err
}

// Claimed is what [Registry.Claim] wrote: the revisions of the record and
// of the lease.
type Claimed struct {
	Record, Lease uint64
}

// claimRecord is Claim's record part.
func (r *Registry) claimRecord(ctx context.Context, in Instance, opts ClaimOptions) (uint64, error) {
	probe := r.ClaimWait(opts)
	for range casAttempts {
		rev, err := r.createRecord(ctx, in)
		if errors.Is(err, ErrRevisionMismatch) {
			continue // written and removed meanwhile
		}
		if !errors.Is(err, ErrExists) {
			return rev, err
		}
		held, err := r.GetEntry(ctx, in.Service, in.InstanceID)
		switch {
		case errors.Is(err, ErrNotFound):
			continue // removed meanwhile
		case errors.Is(err, ErrInvalidInstance):
			// A malformed record holds nobody's identity: overwrite it.
			if rev, err := r.updateAfterRead(ctx, in); !errors.Is(err, ErrRevisionMismatch) {
				return rev, err
			}
			continue
		case err != nil:
			return 0, err
		}
		if held.Owner != in.Owner && !opts.Replace {
			life, err := r.watchForLife(ctx, held, probe, opts)
			switch {
			case err != nil:
				return 0, err
			case life == lifeGone:
				continue
			case life == lifeAnswers:
				return 0, fmt.Errorf("%w: %s/%s is held by a process at %s that answers (owner %q, incarnation %d); stop it, or replace it",
					ErrInUse, in.Service, in.InstanceID, held.Addr(), held.Owner, held.Incarnation)
			case life == lifeRenewed:
				return 0, fmt.Errorf("%w: %s/%s is held by owner %q at %s (incarnation %d), which refreshed its record within %v; stop it, or replace it",
					ErrInUse, in.Service, in.InstanceID, held.Owner, held.Addr(), held.Incarnation, probe)
			}
			r.log.Warn().Str("service", in.Service).Str("id", in.InstanceID).Str("owner", held.Owner).
				Int64("incarnation", held.Incarnation).Dur("probe", probe).
				Msg("serverlist: the instance ID's record was not refreshed; its holder is presumed dead, taking the ID over")
		}
		rev, err = r.updateRecord(ctx, in, held.Revision)
		if !errors.Is(err, ErrRevisionMismatch) {
			return rev, err
		}
	}
	return 0, fmt.Errorf("%w: %s/%s kept changing while claimed", ErrRevisionMismatch, in.Service, in.InstanceID)
}

// updateAfterRead overwrites whatever the key holds now, conditionally on
// the revision it reads.
func (r *Registry) updateAfterRead(ctx context.Context, in Instance) (uint64, error) {
	key, _, err := encodeInstance(in)
	if err != nil {
		return 0, err
	}
	e, err := r.kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, fmt.Errorf("%w: %s/%s was removed", ErrRevisionMismatch, in.Service, in.InstanceID)
		}
		return 0, fmt.Errorf("serverlist: get %s/%s: %w", in.Service, in.InstanceID, err)
	}
	return r.updateRecord(ctx, in, e.Revision())
}

// life is what watchForLife saw of a record's holder.
type life int

const (
	// lifeNone: nothing happened for the whole watch, or the lease ran out
	// or was ended. The holder is presumed dead.
	lifeNone life = iota
	// lifeAnswers: ClaimOptions.HolderAnswers said the holder answers.
	lifeAnswers
	// lifeRenewed: the record was written again, or its lease renewed.
	lifeRenewed
	// lifeGone: the record was removed.
	lifeGone
)

// watchForLife watches the record held and its lease for up to d, for a
// sign of its holder's life: opts.HolderAnswers (asked once the watch
// runs, so that nothing written meanwhile is missed), a write of the record
// after held's revision, a renewal of the lease. It logs the wait and tells
// opts.OnProbe once it watches for a renewal.
func (r *Registry) watchForLife(ctx context.Context, held Entry, d time.Duration, opts ClaimOptions) (life, error) {
	service, id := held.Service, held.InstanceID
	key, err := EncodeKey(service, id)
	if err != nil {
		return lifeNone, err
	}
	lease := key + leaseSuffix
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	w, err := r.kv.WatchFiltered(wctx, []string{key, lease}, jetstream.UpdatesOnly())
	if err != nil {
		return lifeNone, fmt.Errorf("serverlist: watch %s/%s: %w", service, id, err)
	}
	defer stopWatcher(w)
	if opts.HolderAnswers != nil {
		answers := opts.HolderAnswers(wctx, held.Instance.Clone())
		if ctx.Err() != nil {
			return lifeNone, fmt.Errorf("serverlist: claim %s/%s: %w", service, id, ctx.Err())
		}
		if answers {
			return lifeAnswers, nil
		}
	}
	r.log.Info().Str("service", service).Str("id", id).Str("owner", held.Owner).
		Int64("incarnation", held.Incarnation).Dur("probe", d).
		Msg("serverlist: the instance ID is held by another process's record; watching it for a refresh before taking it over (a restart after a crash waits here)")
	if opts.OnProbe != nil {
		opts.OnProbe(held.Instance.Clone(), d)
	}
	for {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return lifeNone, fmt.Errorf("serverlist: claim %s/%s: %w", service, id, ctx.Err())
			}
			return lifeNone, nil
		case e, ok := <-w.Updates():
			if !ok {
				return lifeNone, fmt.Errorf("serverlist: watch %s/%s: watcher closed", service, id)
			}
			switch {
			case e == nil:
			case e.Key() == lease && e.Operation() == jetstream.KeyValuePut:
				return lifeRenewed, nil
			case e.Key() == lease:
				return lifeNone, nil // the lease ran out or was ended
			case e.Operation() != jetstream.KeyValuePut:
				return lifeGone, nil
			case e.Revision() > held.Revision:
				return lifeRenewed, nil
			}
		}
	}
}

// Superseded reports whether the record other, found under the key of
// ours, replaced ours legitimately: another owner with a later incarnation
// (a newer process, such as one started to replace ours) that is not in the
// future of now beyond events.MaxIncarnationAhead. A process whose record
// was superseded yields; one whose record was overwritten otherwise (an
// older or forged registration) re-asserts its own.
func Superseded(ours, other Instance, now time.Time) bool {
	return other.Owner != ours.Owner &&
		other.Incarnation > ours.Incarnation &&
		events.CheckIncarnation(other.Incarnation, now) == nil
}
