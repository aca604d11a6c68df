package gossip

import (
	"errors"
	"strings"
)

// Sentinel errors. Every error this package returns wraps one (or, for an
// oversized or invalid Meta in a Config, two) of them with details; test with
// errors.Is.
var (
	// ErrInvalidConfig reports a Config that New refuses (or, for a host
	// name that does not resolve, Start): a BindAddr or
	// AdvertiseAddr that is not "host:port", a SecretKey that is not 16, 24
	// or 32 bytes, a Label over 255 bytes, an unknown Profile, a negative or
	// inverted JoinRetry, an empty Join entry, a NodeName over MaxNodeNameLength
	// bytes, or an invalid Meta (then ErrInvalidMeta or ErrMetaTooLarge is
	// wrapped too).
	ErrInvalidConfig = errors.New("gossip: invalid config")

	// ErrInvalidMeta reports a Meta whose Role is neither RoleInstance nor
	// RoleGateway, an instance Meta without Service or InstanceID or with an
	// Incarnation that is not positive, or a field that is not valid UTF-8.
	ErrInvalidMeta = errors.New("gossip: invalid meta")

	// ErrMetaTooLarge reports a Meta whose JSON encoding is longer than
	// MaxMetaSize (memberlist's MetaMaxSize, 512 bytes).
	ErrMetaTooLarge = errors.New("gossip: meta too large")

	// ErrClosed reports a call on a Node that has been closed (or, for
	// Start and UpdateMeta, that left), or a WaitJoined that was cut short by
	// Leave or Close.
	ErrClosed = errors.New("gossip: node closed")

	// ErrTimeout reports that Leave or UpdateMeta gave up waiting for its
	// broadcast to be sent; the message may still spread later.
	ErrTimeout = errors.New("gossip: timeout")

	// ErrStart reports that Start failed: memberlist could not be created
	// (the address could not be bound, or no address to advertise was
	// found), or the node was already started.
	ErrStart = errors.New("gossip: start failed")
)

// metaError is a Config's invalid Meta: it wraps ErrInvalidConfig and the
// Meta's own error (ErrInvalidMeta or ErrMetaTooLarge), and names the
// package once: "gossip: invalid config: Meta: invalid meta: ...", not
// "gossip: invalid config: Meta: gossip: invalid meta: ...".
type metaError struct{ err error }

func (e *metaError) Error() string {
	return ErrInvalidConfig.Error() + ": Meta: " + strings.TrimPrefix(e.err.Error(), "gossip: ")
}

func (e *metaError) Unwrap() []error { return []error{ErrInvalidConfig, e.err} }
