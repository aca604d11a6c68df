// Package logx builds the binaries' zerolog loggers: human-readable console
// lines when the output is a terminal, JSON otherwise, both with
// timestamps to the millisecond.
package logx

import (
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// TimeFormat is the timestamp of a JSON log line: RFC 3339 with
// milliseconds, so that a crash and the removal it causes, a few
// milliseconds apart, can be ordered from the logs.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// consoleTimeFormat is the timestamp of a console line.
const consoleTimeFormat = "15:04:05.000"

// New returns a logger writing to w at level, with timestamps in
// TimeFormat (consoleTimeFormat on a terminal).
func New(w io.Writer, level zerolog.Level) zerolog.Logger {
	if f, ok := w.(*os.File); ok && IsTerminal(f) {
		w = zerolog.ConsoleWriter{Out: f, TimeFormat: consoleTimeFormat}
	}
	return zerolog.New(w).Level(level).Hook(timestamp{})
}

// timestamp adds the time in TimeFormat to every line. zerolog's own
// Timestamp formats with its package-level TimeFieldFormat (whole seconds
// unless a program changes it for every logger of the process); this one
// is the same in every binary without touching it. The console writer
// reads it back (RFC 3339 parsing accepts the fraction).
type timestamp struct{}

func (timestamp) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().Format(TimeFormat))
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
