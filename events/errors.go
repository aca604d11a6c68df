package events

import "errors"

// Sentinel errors. Every error returned by this package wraps one (or, for a
// bad service token inside a subject, two) of them with details such as the
// field name; test with errors.Is.
var (
	// ErrMalformed reports a payload that is not a JSON object in valid
	// UTF-8, or a field of the wrong JSON type (an incarnation given as a
	// string, say).
	ErrMalformed = errors.New("events: malformed payload")

	// ErrTooLarge reports a payload above MaxPayloadSize. Such a payload is
	// rejected before any parsing.
	ErrTooLarge = errors.New("events: payload too large")

	// ErrUnsupportedVersion reports a payload whose "v" is not a version this
	// package understands (currently only 1).
	ErrUnsupportedVersion = errors.New("events: unsupported version")

	// ErrMissingField reports a required field that is absent or null.
	ErrMissingField = errors.New("events: missing field")

	// ErrInvalidField reports a field of the right type with a value outside
	// its rules: an incarnation that is not positive, a time that is not
	// RFC 3339, an unknown kind, a reason too long or on an online event, a
	// region too long.
	ErrInvalidField = errors.New("events: invalid field")

	// ErrInvalidService reports a service name that is not a single NATS
	// token of at most MaxServiceLength bytes from [A-Za-z0-9_-].
	ErrInvalidService = errors.New("events: invalid service name")

	// ErrInvalidInstanceID reports an instance ID that is empty, longer than
	// MaxInstanceIDLength bytes, not valid UTF-8 or holding a control
	// character.
	ErrInvalidInstanceID = errors.New("events: invalid instance ID")

	// ErrInvalidPrefix reports a subject prefix that is not one or more
	// tokens from [A-Za-z0-9_-] separated by '.'.
	ErrInvalidPrefix = errors.New("events: invalid subject prefix")

	// ErrBadSubject reports a subject that is not
	// <prefix>.svc.<service>.online or <prefix>.svc.<service>.offline.
	ErrBadSubject = errors.New("events: bad subject")

	// ErrFutureIncarnation reports an incarnation further in the future of
	// the receiver's clock than MaxIncarnationAhead (see CheckIncarnation).
	ErrFutureIncarnation = errors.New("events: incarnation in the future")

	// ErrMismatch reports a message whose payload disagrees with its subject
	// on the service or the kind.
	ErrMismatch = errors.New("events: subject and payload disagree")
)
