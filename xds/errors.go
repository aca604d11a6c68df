package pushlbxds

import "errors"

var (
	// ErrInvalidOption is wrapped by NewServer's errors about its
	// arguments.
	ErrInvalidOption = errors.New("pushlbxds: invalid option")

	// ErrStopped is returned by Serve once Stop was called.
	ErrStopped = errors.New("pushlbxds: server stopped")
)
