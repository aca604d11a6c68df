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

	// ErrNotNATS wraps the error returned when the server at a URL is not
	// a NATS server: its first line is not NATS's INFO, or it says nothing
	// on connection and answers an HTTP request (an HTTP port given to
	// -nats). It is returned at once: retrying would not change it.
	ErrNotNATS = errors.New("natsconn: not a NATS server")
)
