package pushlb

import (
	"errors"
	"fmt"

	"github.com/pushlb/pushlb/lbvisitor"
)

var (
	// ErrInvalidOption is wrapped by every error of New: an option with a
	// bad value, or options that do not go together.
	ErrInvalidOption = errors.New("pushlb: invalid option")

	// ErrStarted is returned by a second call to Start.
	ErrStarted = errors.New("pushlb: already started")

	// ErrClosed is returned by Start on a closed client.
	ErrClosed = errors.New("pushlb: closed")

	// ErrNotStarted is returned by Follow for a service not followed yet
	// while the client is not started.
	ErrNotStarted = errors.New("pushlb: not started")

	// ErrUnknownService is wrapped by the error of Balancer for a service
	// the client has no balancer for: nothing announced it and no
	// configuration names it. A Transport's error for such a service
	// matches it too (and lbhttp.ErrUnknownService).
	ErrUnknownService = lbvisitor.ErrUnknownService
)

func optionError(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, a...)...)
}
