package subscriber

import "errors"

var (
	// ErrInvalidConfig wraps configuration errors.
	ErrInvalidConfig = errors.New("subscriber: invalid config")
	// ErrStopped is returned by Start after Stop.
	ErrStopped = errors.New("subscriber: stopped")
)
