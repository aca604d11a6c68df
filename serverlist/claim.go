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
	// silent. ctx still bounds the wait.
	OnProbe func(held Instance, probe time.Duration)
}

// Claim registers in as the one live process of its instance ID: the
// identity rule of the wire protocol (docs/protocol.md, "Identity"). in.Owner
// must name the caller's process.
//
//   - A key with no live entry (never written, deregistered, expired) is
//     created with a create-only write.
//   - A record of the same owner (a re-announcement) is updated in place.
//   - A record of another owner is taken over at once with opts.Replace.
//     Otherwise Claim watches it for opts.Probe: if its holder refreshes it
//     meanwhile, the holder is alive and Claim fails with an error wrapping
//     ErrInUse, writing nothing; if the record goes away, Claim creates it;
//     if nothing happens, the holder is presumed dead (a crash whose lease has
//     not run out yet) and Claim takes the record over.
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
	probe := opts.Probe
	if probe <= 0 {
		probe = r.cfg.TTL / 2
	}
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
			r.log.Info().Str("service", in.Service).Str("id", in.InstanceID).Str("owner", held.Owner).
				Int64("incarnation", held.Incarnation).Dur("probe", probe).
				Msg("serverlist: the instance ID is held by another process's record; watching it for a refresh before taking it over (a restart after a crash waits here)")
			if opts.OnProbe != nil {
				opts.OnProbe(held.Clone(), probe)
			}
			alive, gone, err := r.watchForLife(ctx, in.Service, in.InstanceID, held.Revision, probe)
			if err != nil {
				return 0, err
			}
			if gone {
				continue
			}
			if alive {
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

// watchForLife watches the record of service/id and its lease for up to d.
// alive: the record was written after revision rev, or the lease was
// renewed, meanwhile; gone: the record was removed. Neither: nothing
// happened, or the lease ran out (its holder is dead either way).
func (r *Registry) watchForLife(ctx context.Context, service, id string, rev uint64, d time.Duration) (alive, gone bool, err error) {
	key, err := EncodeKey(service, id)
	if err != nil {
		return false, false, err
	}
	lease := key + leaseSuffix
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	w, err := r.kv.WatchFiltered(wctx, []string{key, lease}, jetstream.UpdatesOnly())
	if err != nil {
		return false, false, fmt.Errorf("serverlist: watch %s/%s: %w", service, id, err)
	}
	defer stopWatcher(w)
	for {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return false, false, fmt.Errorf("serverlist: claim %s/%s: %w", service, id, ctx.Err())
			}
			return false, false, nil
		case e, ok := <-w.Updates():
			if !ok {
				return false, false, fmt.Errorf("serverlist: watch %s/%s: watcher closed", service, id)
			}
			switch {
			case e == nil:
			case e.Key() == lease && e.Operation() == jetstream.KeyValuePut:
				return true, false, nil
			case e.Key() == lease:
				return false, false, nil // the lease ran out or was ended
			case e.Operation() != jetstream.KeyValuePut:
				return false, true, nil
			case e.Revision() > rev:
				return true, false, nil
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
