// Package logx builds the binaries' zerolog loggers: human-readable console
// lines when the output is a terminal, JSON otherwise.
package logx

import (
	"io"
	"os"

	"github.com/rs/zerolog"
)

// New returns a logger writing to w at level, with timestamps.
func New(w io.Writer, level zerolog.Level) zerolog.Logger {
	if f, ok := w.(*os.File); ok && IsTerminal(f) {
		w = zerolog.ConsoleWriter{Out: f, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
