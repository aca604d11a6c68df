package balancer

import "errors"

var (
	// ErrNoServers is returned by Choose when the balancer has no server to
	// offer: the list is empty or every server is down.
	ErrNoServers = errors.New("balancer: no servers available")

	// ErrInvalidConfig wraps every configuration error: an unknown rule or
	// filter name, a malformed value, a value out of range.
	ErrInvalidConfig = errors.New("balancer: invalid config")

	// ErrClosed is returned by operations on a closed balancer or factory.
	ErrClosed = errors.New("balancer: closed")
)

// FieldError is an invalid setting found by [Config.Validate]. Its message
// is Err's; Field lets a loader point at the line that set the value.
type FieldError struct {
	// Field is the setting's YAML key path within a Config:
	// "breaker.threshold", "listOfServers[2]".
	Field string
	// Err says what is wrong; it wraps ErrInvalidConfig.
	Err error
}

func (e *FieldError) Error() string { return e.Err.Error() }

func (e *FieldError) Unwrap() error { return e.Err }
