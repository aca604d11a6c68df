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
