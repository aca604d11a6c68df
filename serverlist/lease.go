package serverlist

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Leases kept apart from records (wire protocol section 4, "Leases").
//
// A publisher that claims its ID ([Registry.Claim]) writes its record once,
// marked to never age out, and proves that it lives by refreshing a second,
// small key: its lease, "<record key>.lease". Gateways watch the record
// keys only ([RecordKeys]), so a refresh reaches no gateway. A lease that
// is not renewed for a lease fires its expiry signal (a scheduled lease,
// lease_schedule.go) or ages out with the bucket's TTL (a plain lease, on a
// bucket that cannot schedule); a [Reaper] then removes the record, which
// every gateway sees as the instance's removal.
//
// A record written by [Registry.Register] (protocol version 1, or a
// publisher in a language whose client cannot set headers) carries its own
// lease: it ages out unless re-put, as before. Gateways handle both forms.

const (
	// RecordKeys is the key filter of every instance record,
	// "<service>.<encoded id>": two tokens. Leases and the reaper's lock
	// have three and never match it.
	RecordKeys = "*.*"
	// LeaseKeys is the key filter of every lease.
	LeaseKeys = "*.*" + leaseSuffix
	// leaseSuffix ends a lease key: "<record key>.lease".
	leaseSuffix = ".lease"
	// ReaperLockKey is the key the reapers of a bucket elect their leader
	// with (see [Reaper]).
	ReaperLockKey = "_pushlb.reaper.lock"

	// headerTTL is JetStream's per-message TTL header (nats-server 2.11+,
	// allowed on buckets created with limit markers); "never" exempts the
	// message from the bucket's MaxAge.
	headerTTL = "Nats-TTL"
	// headerExpectLast makes a write conditional on the subject's last
	// sequence (0: no live message).
	headerExpectLast = "Nats-Expected-Last-Subject-Sequence"
)

// LeaseKey returns the key of the instance's lease, "<record key>.lease",
// or an error wrapping ErrInvalidInstance if the service or ID is invalid.
func LeaseKey(service, id string) (string, error) {
	key, err := EncodeKey(service, id)
	if err != nil {
		return "", err
	}
	return key + leaseSuffix, nil
}

// RecordOfLease returns the record key a lease key belongs to, or false if
// key is not a lease key.
func RecordOfLease(key string) (string, bool) { return recordBefore(key, leaseSuffix) }

// recordBefore returns the record key that key is, followed by suffix, or
// false if it is not.
func recordBefore(key, suffix string) (string, bool) {
	rec, ok := cutSuffix(key, suffix)
	if !ok {
		return "", false
	}
	if _, _, err := DecodeKey(rec); err != nil {
		return "", false
	}
	return rec, true
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) <= len(suffix) || s[len(s)-len(suffix):] != suffix {
		return s, false
	}
	return s[:len(s)-len(suffix)], true
}

// writePersistent stores a record that never ages out (Nats-TTL: never): its
// life is its lease's. expect is the revision the key must be at (0: no live
// entry, a create). It returns the new revision, or an error wrapping
// ErrRevisionMismatch.
func (r *Registry) writePersistent(ctx context.Context, key string, val []byte, expect uint64) (uint64, error) {
	m := nats.NewMsg(r.subject(key))
	m.Data = val
	m.Header.Set(headerTTL, "never")
	m.Header.Set(headerExpectLast, strconv.FormatUint(expect, 10))
	ack, err := r.js.PublishMsg(ctx, m)
	if wrongLastSequence(err) {
		return 0, fmt.Errorf("%w: %s is no longer at revision %d", ErrRevisionMismatch, key, expect)
	}
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// wrongLastSequence reports whether err is JetStream's refusal of a
// conditional write: the subject is no longer at the expected sequence.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// subject is the subject a write of key is published on.
func (r *Registry) subject(key string) string { return "$KV." + r.cfg.Bucket + "." + key }

// createPersistent stores a persistent record only if its key holds no live
// entry: never written, or removed (then its removal marker is written
// over). It returns an error wrapping ErrExists when the key holds a record.
func (r *Registry) createPersistent(ctx context.Context, key string, val []byte) (uint64, error) {
	rev, err := r.writePersistent(ctx, key, val, 0)
	if !errors.Is(err, ErrRevisionMismatch) {
		return rev, err
	}
	_, err = r.kv.Get(ctx, key)
	switch {
	case err == nil:
		return 0, fmt.Errorf("%w: %s", ErrExists, key)
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, err
	}
	// A removal marker holds the key: write over it, at its sequence.
	last, err := r.lastMessage(ctx, key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return r.writePersistent(ctx, key, val, 0) // the marker aged out meanwhile
	}
	if err != nil {
		return 0, err
	}
	if !isRemoval(last.Header) {
		return 0, fmt.Errorf("%w: %s", ErrExists, key)
	}
	return r.writePersistent(ctx, key, val, last.Sequence)
}

// lastMessage is the last message the bucket's stream holds of key: a
// record or a removal marker (jetstream.ErrMsgNotFound for none).
func (r *Registry) lastMessage(ctx context.Context, key string) (*jetstream.RawStreamMsg, error) {
	st, err := r.bucketStream(ctx)
	if err != nil {
		return nil, err
	}
	return st.GetLastMsgForSubject(ctx, r.subject(key))
}

// isRemoval reports whether a stored message's headers make it a delete,
// purge or expiry marker.
func isRemoval(h nats.Header) bool {
	switch h.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	}
	return h.Get("Nats-Marker-Reason") != ""
}

// createRecord is [Registry.Create] of a persistent record.
func (r *Registry) createRecord(ctx context.Context, in Instance) (uint64, error) {
	key, val, err := encodeInstance(in)
	if err != nil {
		return 0, err
	}
	rev, err := r.createPersistent(ctx, key, val)
	if err != nil && !errors.Is(err, ErrExists) && !errors.Is(err, ErrRevisionMismatch) {
		err = fmt.Errorf("serverlist: create %s/%s: %w", in.Service, in.InstanceID, err)
	}
	return rev, err
}

// updateRecord is [Registry.Update] of a persistent record.
func (r *Registry) updateRecord(ctx context.Context, in Instance, revision uint64) (uint64, error) {
	key, val, err := encodeInstance(in)
	if err != nil {
		return 0, err
	}
	rev, err := r.writePersistent(ctx, key, val, revision)
	if err != nil && !errors.Is(err, ErrRevisionMismatch) {
		err = fmt.Errorf("serverlist: update %s/%s: %w", in.Service, in.InstanceID, err)
	}
	return rev, err
}

// PutLease starts or renews the instance's lease, whatever the lease key
// held, and returns its revision. owner names the holder (Instance.Owner);
// the lease's value is the owner.
func (r *Registry) PutLease(ctx context.Context, service, id, owner string) (uint64, error) {
	rev, err := r.writeLease(ctx, service, id, owner, nil)
	if err != nil {
		return 0, fmt.Errorf("serverlist: lease %s/%s: %w", service, id, err)
	}
	return rev, nil
}

// RefreshLease renews the instance's lease only if it is still at revision
// (a compare-and-set, so that a holder notices a lease written by another
// process or removed), and returns its new revision, or an error wrapping
// ErrRevisionMismatch.
func (r *Registry) RefreshLease(ctx context.Context, service, id, owner string, revision uint64) (uint64, error) {
	rev, err := r.writeLease(ctx, service, id, owner, &revision)
	if errors.Is(err, ErrRevisionMismatch) {
		return 0, fmt.Errorf("%w: lease of %s/%s is no longer at revision %d", ErrRevisionMismatch, service, id, revision)
	}
	if err != nil {
		return 0, fmt.Errorf("serverlist: refresh lease %s/%s: %w", service, id, err)
	}
	return rev, nil
}

// LeaseMessage returns the message [Registry.RefreshLease] publishes to
// renew the instance's lease at revision (or, with revision nil, the one
// [Registry.PutLease] publishes), for load generators that must write
// exactly what a publisher writes (internal/testkit/scale). A message
// published with an expected revision is refused with the JetStream
// error JSErrCodeStreamWrongLastSequence when the lease moved on.
func (r *Registry) LeaseMessage(service, id, owner string, revision *uint64) (*nats.Msg, error) {
	key, err := LeaseKey(service, id)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(r.subject(key))
	m.Data = []byte(owner)
	if revision != nil {
		m.Header.Set(headerExpectLast, strconv.FormatUint(*revision, 10))
	}
	if r.scheduledLeases.Load() {
		ttl := scheduleEvery(r.cfg.TTL)
		m.Header.Set(headerSchedule, "@every "+ttl.String())
		m.Header.Set(headerScheduleTarget, r.subject(key[:len(key)-len(leaseSuffix)]+expirySuffix))
		// The lease never ages out by itself: it would take its schedule
		// along (a message's TTL cannot exceed the bucket's). Its signal
		// fires every period until the reaper ends it, so a reaper that
		// starts late still finds it.
		m.Header.Set(headerTTL, "never")
	}
	return m, nil
}

// writeLease publishes the instance's lease, conditionally on its revision
// when expect is not nil, and returns the new revision, or an error
// wrapping ErrRevisionMismatch.
func (r *Registry) writeLease(ctx context.Context, service, id, owner string, expect *uint64) (uint64, error) {
	m, err := r.LeaseMessage(service, id, owner, expect)
	if err != nil {
		return 0, err
	}
	ack, err := r.js.PublishMsg(ctx, m)
	if wrongLastSequence(err) {
		return 0, fmt.Errorf("%w: %s", ErrRevisionMismatch, m.Subject)
	}
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// LeaseRevision returns the revision of the instance's live lease, or an
// error wrapping ErrNotFound when it has none (never written, expired or
// removed).
func (r *Registry) LeaseRevision(ctx context.Context, service, id string) (uint64, error) {
	key, err := LeaseKey(service, id)
	if err != nil {
		return 0, err
	}
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, fmt.Errorf("%w: lease of %s/%s", ErrNotFound, service, id)
	}
	if err != nil {
		return 0, fmt.Errorf("serverlist: get lease %s/%s: %w", service, id, err)
	}
	return e.Revision(), nil
}

// DeleteLease ends the instance's lease. An absent lease is not an error.
func (r *Registry) DeleteLease(ctx context.Context, service, id string) error {
	key, err := LeaseKey(service, id)
	if err != nil {
		return err
	}
	if err := r.kv.Purge(ctx, key); err != nil {
		return fmt.Errorf("serverlist: end lease %s/%s: %w", service, id, err)
	}
	return nil
}

// deleteLeaseOwned ends the instance's lease if its value names owner. An
// absent lease, or one of another owner, is left alone.
func (r *Registry) deleteLeaseOwned(ctx context.Context, service, id, owner string) error {
	key, err := LeaseKey(service, id)
	if err != nil {
		return err
	}
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serverlist: get lease %s/%s: %w", service, id, err)
	}
	if string(e.Value()) != owner {
		return nil
	}
	err = r.kv.Purge(ctx, key, jetstream.LastRevision(e.Revision()))
	if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("serverlist: end lease %s/%s: %w", service, id, err)
	}
	return nil
}
