package natsconn

import "errors"

var (
	// ErrInvalidConfig wraps every configuration error found before any
	// connection attempt: conflicting credentials (a user and a token), a
	// client certificate without its key, a negative timeout, a TLS or
	// credentials file that cannot be read.
	ErrInvalidConfig = errors.New("natsconn: invalid config")

	// ErrUnreachable wraps the error returned when no connection could be
	// made within Config.ConnectTimeout.
	ErrUnreachable = errors.New("natsconn: NATS unreachable")
)
