package serverlist

import "errors"

var (
	// ErrNotFound is returned when the registry holds no live entry for an
	// instance: it was never registered, was deregistered, or its lease
	// expired. Lookup returns it, wrapped, after its retries are spent.
	ErrNotFound = errors.New("serverlist: not found")

	// ErrInvalidInstance wraps every validation error of an [Instance]: a
	// service name that is not NATS-token safe, an empty or oversized
	// instance ID, a missing host, a port out of range.
	ErrInvalidInstance = errors.New("serverlist: invalid instance")

	// ErrInvalidKey is returned by [DecodeKey] for a key that [EncodeKey]
	// cannot have produced. Mirror counts such entries and skips them.
	ErrInvalidKey = errors.New("serverlist: invalid key")

	// ErrInvalidConfig wraps configuration errors: a negative duration, a
	// bucket name JetStream does not accept, a value out of range.
	ErrInvalidConfig = errors.New("serverlist: invalid config")

	// ErrInUse is returned by [Registry.Claim] when another live process
	// holds the instance ID: its record is under another owner, and the
	// holder answers (ClaimOptions.HolderAnswers) or refreshed its record
	// or lease while Claim watched it.
	ErrInUse = errors.New("serverlist: instance ID in use by another live process")

	// ErrRevisionMismatch is returned by the conditional writes
	// ([Registry.Update], [Registry.DeregisterRevision]) when the entry is no
	// longer at the revision given: someone wrote it since.
	ErrRevisionMismatch = errors.New("serverlist: revision mismatch")

	// ErrExists is returned by [Registry.Create] when the key holds a live
	// entry.
	ErrExists = errors.New("serverlist: entry exists")

	// ErrClosed is returned by operations on a stopped [Mirror].
	ErrClosed = errors.New("serverlist: closed")

	// ErrNoJetStream is returned by Open when the NATS server answers no
	// JetStream request: JetStream is off there.
	ErrNoJetStream = errors.New("serverlist: JetStream is not enabled on the NATS server (start nats-server with -js, or add jetstream {} to its configuration; the gateway's embedded server has it on)")

	// ErrLeaseMismatch is returned by Open with RegistryConfig.RequireTTL
	// when the existing bucket's TTL is not the lease asked for.
	ErrLeaseMismatch = errors.New("serverlist: lease disagrees with the registry bucket's TTL")
)
