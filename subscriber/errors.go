package subscriber

import "errors"

var (
	// ErrInvalidConfig wraps configuration errors.
	ErrInvalidConfig = errors.New("subscriber: invalid config")
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("subscriber: closed")
	// ErrDeferred, returned (or wrapped) by a Handler, says that it holds
	// the list back on purpose and wants it offered again later: the list
	// is delivered again after the handler-error backoff (100 ms doubling
	// to 5 s), without counting a handler error or logging one.
	ErrDeferred = errors.New("subscriber: list deferred by the handler")
)
