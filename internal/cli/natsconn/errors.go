package natsconn

import (
	"errors"
	"strings"
)

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

// Problem is one invalid setting of a Config, or settings that conflict,
// said for the command line and for a configuration file.
type Problem struct {
	// Key is the YAML key of the setting at fault in a nats: section
	// ("connectTimeout"); of settings that conflict, the first.
	Key string
	// Msg says what is wrong with it, naming other settings by their keys:
	// "-1s is negative", "cannot be used with passwordFile".
	Msg string
	// FlagMsg says it naming the settings by their flags: "-nats-timeout
	// -1s is negative".
	FlagMsg string
}

// Problems are what Validate found wrong, in the order of the fields. As
// an error they read "natsconn: invalid config: " and each FlagMsg, "; "
// between them, and they wrap ErrInvalidConfig. A program that reads a
// file places each by its Key instead (errors.As).
type Problems []Problem

func (ps Problems) Error() string {
	msgs := make([]string, len(ps))
	for i, p := range ps {
		msgs[i] = p.FlagMsg
	}
	return ErrInvalidConfig.Error() + ": " + strings.Join(msgs, "; ")
}

func (ps Problems) Unwrap() error { return ErrInvalidConfig }
