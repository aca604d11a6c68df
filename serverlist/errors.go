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

	// ErrClosed is returned by operations on a stopped [Mirror].
	ErrClosed = errors.New("serverlist: closed")
)
