package main

import (
	"errors"
	"strings"
)

// Errors of the sync, matched with errors.Is. Each is logged with the
// backend it concerns, counted in pushlb_haproxy_sync_errors_total by kind,
// and retried with backoff; none stops the other backends.
var (
	// ErrSocket: the Runtime API socket refused the connection, or the
	// exchange broke (HAProxy stopped, restarted, or the path is wrong).
	ErrSocket = errors.New("haproxy-sync: runtime API unreachable")
	// ErrReply: HAProxy answered something the sync cannot read.
	ErrReply = errors.New("haproxy-sync: unexpected reply")
	// ErrUnknownBackend: HAProxy has no backend of that name.
	ErrUnknownBackend = errors.New("haproxy-sync: unknown backend")
	// ErrStaticAlgorithm: the backend's balancing algorithm cannot take
	// servers added at runtime (static-rr, or a hash without
	// "hash-type consistent"): HAProxy 2.6 refuses "add server" there.
	ErrStaticAlgorithm = errors.New("haproxy-sync: backend's balancing algorithm is not dynamic")
	// ErrNameClash: the backend already has a server of the name the sync
	// gives an instance, one it did not see when it last read the backend.
	ErrNameClash = errors.New("haproxy-sync: server name already in use")
	// ErrHostName: an instance announced a host name that could not be
	// resolved (or -resolve=false): HAProxy 2.6's "add server" takes IP
	// addresses only. The instance is left out of the backend.
	ErrHostName = errors.New("haproxy-sync: host name not resolved")
	// ErrRefused: HAProxy refused a command (CommandError has its reply).
	ErrRefused = errors.New("haproxy-sync: command refused")
)

// CommandError is a command HAProxy refused, with its answer.
type CommandError struct {
	Command string
	Reply   string
}

func (e *CommandError) Error() string {
	return "haproxy-sync: HAProxy refused " + firstWord(e.Command) + ": " + e.Reply
}

// Is makes a refusal match ErrRefused, and the kinds HAProxy's replies
// tell apart their own sentinel.
func (e *CommandError) Is(target error) bool {
	switch target {
	case ErrRefused:
		return true
	case ErrNameClash:
		return strings.Contains(e.Reply, "Already exists a server with the same name")
	case ErrStaticAlgorithm:
		return strings.Contains(e.Reply, "dynamic load balancing")
	case ErrUnknownBackend:
		return strings.Contains(e.Reply, "No such backend") || strings.Contains(e.Reply, "Can't find backend")
	}
	return false
}

// busy reports whether HAProxy refused to delete a server because it
// still has connections: the deletion is retried, it is not an error.
func busy(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce) && (strings.Contains(ce.Reply, "connections attached") ||
		strings.Contains(ce.Reply, "still has") || strings.Contains(ce.Reply, "in use"))
}

// errorKind names err's kind for the errors metric and the logs.
func errorKind(err error) string {
	switch {
	case errors.Is(err, ErrSocket):
		return "socket"
	case errors.Is(err, ErrUnknownBackend):
		return "unknown_backend"
	case errors.Is(err, ErrStaticAlgorithm):
		return "static_algorithm"
	case errors.Is(err, ErrNameClash):
		return "name_clash"
	case errors.Is(err, ErrHostName):
		return "host_name"
	case errors.Is(err, ErrRefused):
		return "refused"
	case errors.Is(err, ErrReply):
		return "reply"
	}
	return "other"
}
