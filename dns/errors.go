package dns

import "errors"

var (
	// ErrInvalidConfig is wrapped by the errors of New: a Config field
	// with a bad value, named in the error.
	ErrInvalidConfig = errors.New("dns: invalid config")

	// ErrStarted is returned by a second call to Start.
	ErrStarted = errors.New("dns: already started")

	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("dns: closed")

	// ErrUnknownService is what a Source's error wraps for a service that
	// no one announced: the answer is NXDOMAIN. pushlb.ErrUnknownService
	// is answered so too.
	ErrUnknownService = errors.New("dns: unknown service")
)
