package lbhttp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/pushlb/pushlb/balancer"
)

var (
	// ErrNoServers is balancer.ErrNoServers itself, re-exported: a service
	// whose balancer has nothing to choose from fails with an *Error that
	// matches both names through errors.Is.
	ErrNoServers = balancer.ErrNoServers

	// ErrUnknownService is matched by the *Error of a request whose URL host
	// names no service the Balancers know (or names none at all).
	ErrUnknownService = errors.New("lbhttp: unknown service")

	// ErrAllTriesFailed is matched by the *Error of a request for which
	// every attempt failed, or for which no retry was allowed after a
	// failure. The *Error also wraps the last cause and counts the attempts.
	ErrAllTriesFailed = errors.New("lbhttp: all tries failed")

	// ErrInvalidOption wraps every error of an option passed to NewTransport
	// or NewProxy.
	ErrInvalidOption = errors.New("lbhttp: invalid option")
)

// Error is the error of a request the Transport could not complete. It
// matches its Kind (ErrUnknownService, ErrNoServers or ErrAllTriesFailed)
// and its cause through errors.Is and errors.As, so callers may test for
// either: errors.Is(err, ErrAllTriesFailed), errors.As(err, &opErr).
type Error struct {
	// Kind is ErrUnknownService (Balancers.Get failed), ErrNoServers (no
	// server could be chosen for the first attempt) or ErrAllTriesFailed
	// (at least one attempt was made).
	Kind error
	// Service is the service name taken from the request's URL host.
	Service string
	// Attempts is the number of requests sent or tried to send, 0 when no
	// server was chosen at all.
	Attempts int
	// Server is the address of the last server tried, empty when none.
	Server string
	// Err is the last cause: the balancer's error, or the last attempt's.
	Err error
}

// Error describes the failure in one line: the kind, the service, and for
// ErrAllTriesFailed the attempts and the last server, then the cause.
func (e *Error) Error() string {
	var s string
	if e.Kind != nil {
		s = e.Kind.Error()
	} else {
		s = "lbhttp: request failed"
	}
	if e.Kind == ErrUnknownService {
		s += " " + strconv.Quote(e.Service)
	} else {
		s += " for service " + strconv.Quote(e.Service)
	}
	if e.Kind == ErrAllTriesFailed {
		s += " after " + strconv.Itoa(e.Attempts) + " attempt"
		if e.Attempts != 1 {
			s += "s"
		}
		if e.Server != "" {
			s += ", last on " + e.Server
		}
	}
	if e.Err != nil && e.Err != e.Kind {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Err == nil || e.Err == e.Kind {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// Timeout reports whether the last cause was a timeout: a connect or read
// timeout of the last attempt, or the request's own deadline.
func (e *Error) Timeout() bool { return isTimeout(e.Err) }

// ConnectError is a failure to connect to a server: dial refused, host or
// network unreachable, connect timeout. Nothing of the request reached the
// server, so any request may be retried elsewhere, and the failure counts
// towards the server's circuit breaker. The Transport's dialer returns it;
// it wraps the dialer's error (usually a *net.OpError with Op "dial").
type ConnectError struct {
	// Addr is the "host:port" that could not be reached.
	Addr string
	// Err is the dialer's error.
	Err error
}

// Error describes the failure.
func (e *ConnectError) Error() string { return "lbhttp: connect: " + e.Err.Error() }

// Unwrap returns the dialer's error.
func (e *ConnectError) Unwrap() error { return e.Err }

// Timeout reports whether the connect attempt timed out.
func (e *ConnectError) Timeout() bool { return isTimeout(e.Err) }

// IsConnectFailure reports whether err means that no connection to the
// server could be made, so that nothing of the request was sent: a
// *ConnectError, or a *net.OpError whose Op is "dial" (from a transport
// other than this package's). A cancelled or expired request context is
// not a connection failure: it is the caller's decision, not the server's
// fault.
func IsConnectFailure(err error) bool {
	if err == nil {
		return false
	}
	var ce *ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// isTimeout reports whether err is a timeout of any kind.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// optionError wraps an option's complaint in ErrInvalidOption.
func optionError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}
