package serverlist

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Release is what [Reaper.Release] did with the ID of a holder found gone.
type Release uint8

// The outcomes of a release.
const (
	// Released: the lease was ended and the record removed (unless a new
	// claim, which watched for the lease's end, rewrote it first); a new
	// claim of the ID succeeds at once.
	Released Release = iota
	// ReleaseNotLeader: this reaper does not lead; the leader's own
	// gateway does it.
	ReleaseNotLeader
	// ReleaseRenamed: the record no longer names the closed connection
	// (the holder reconnected and rewrote it, or a new holder took the
	// ID), or is gone already: nothing to release.
	ReleaseRenamed
	// ReleaseRenewed: the lease was renewed after the connection closed,
	// or while the reaper released it: its holder lives.
	ReleaseRenewed
	// ReleaseFailed: the registry could not be read or written; the lease
	// ends by itself.
	ReleaseFailed

	numReleases
)

var releaseNames = [numReleases]string{
	Released: "released", ReleaseNotLeader: "not_leader", ReleaseRenamed: "renamed",
	ReleaseRenewed: "renewed", ReleaseFailed: "failed",
}

// String returns the outcome's metric label.
func (o Release) String() string {
	if o >= numReleases {
		return "unknown"
	}
	return releaseNames[o]
}

// releaseTimeout bounds each read and write of a release.
const releaseTimeout = 5 * time.Second

// Release frees the instance ID service/id of a holder that is provably
// gone, so that a restart of the instance claims it at once instead of
// waiting for the lease to end (docs/protocol.md, "Crash detection"). The
// caller proved it: a client-disconnect advisory said that conn closed at
// closedAt (the server's time; zero when unknown), and a probe of the
// instance found it dead.
//
// Only the leader acts. It reads the record and its lease, and ends the
// lease then removes the record, each conditionally on the revision it
// read, only when the record still names conn (a holder that reconnected
// rewrites its record with its new connection) and the lease was not
// renewed after closedAt nor while it released it. So a live holder keeps
// its ID: should it lose its record all the same (it reconnected and had
// not rewritten it yet), it re-asserts it at its next renewal, as after
// any loss of its record.
//
// Safe for concurrent use; it blocks for a few registry round trips.
func (r *Reaper) Release(ctx context.Context, service, id string, conn Connection, closedAt time.Time) (Release, error) {
	if !r.leader.Load() {
		return ReleaseNotLeader, nil
	}
	if conn.IsZero() {
		return ReleaseRenamed, nil
	}
	key, err := EncodeKey(service, id)
	if err != nil {
		return ReleaseFailed, err
	}
	var held Entry
	err = within(ctx, func(ctx context.Context) (err error) {
		held, err = r.reg.GetEntry(ctx, service, id)
		return err
	})
	switch {
	case errors.Is(err, ErrNotFound):
		return ReleaseRenamed, nil
	case err != nil:
		return ReleaseFailed, err
	case held.Connection() != conn:
		return ReleaseRenamed, nil
	}
	var renewed bool
	err = within(ctx, func(ctx context.Context) (err error) {
		renewed, err = r.endLease(ctx, key, func(lease jetstream.KeyValueEntry) bool {
			return !closedAt.IsZero() && lease.Created().After(closedAt)
		})
		return err
	})
	switch {
	case err != nil:
		return ReleaseFailed, fmt.Errorf("serverlist: release %s: end the lease: %w", key, err)
	case renewed:
		return ReleaseRenewed, nil
	}
	err = within(ctx, func(ctx context.Context) error {
		return r.reg.kv.Purge(ctx, key, jetstream.LastRevision(held.Revision))
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		// Rewritten since the lease ended: a restart took the ID over
		// (it watched for the lease's end), or the holder re-asserted.
		// Released all the same; the record is not ours to remove.
		r.log.Info().Str("key", key).Uint64("revision", held.Revision).Str("owner", held.Owner).
			Msg("serverlist: reaper released the instance ID: lease ended; the record was rewritten meanwhile")
		return Released, nil
	case err != nil:
		return ReleaseFailed, fmt.Errorf("serverlist: release %s/%s: remove the record: %w", service, id, err)
	}
	r.log.Info().Str("key", key).Uint64("revision", held.Revision).Str("owner", held.Owner).
		Str("why", "its NATS connection closed and a probe found it dead").
		Msg("serverlist: reaper released the instance ID: lease ended, record removed")
	return Released, nil
}

// within runs f with ctx bounded by releaseTimeout.
func within(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	return f(ctx)
}
