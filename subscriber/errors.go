package subscriber

import "errors"

var (
	// ErrInvalidConfig wraps configuration errors.
	ErrInvalidConfig = errors.New("subscriber: invalid config")
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("subscriber: closed")
)
