package pushlbk8s

import "errors"

var (
	// ErrInvalidConfig wraps every error of a Config that cannot work.
	ErrInvalidConfig = errors.New("pushlbk8s: invalid config")
	// errForeign is a record held by another owner: left alone.
	errForeign = errors.New("pushlbk8s: record held by another owner")
)
