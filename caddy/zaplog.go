package pushlbcaddy

import (
	"bytes"
	"encoding/json"
	"sort"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapWriter routes pushlb's zerolog output through a zap logger: each
// zerolog event (one JSON object) becomes one zap entry at the matching
// level, with the event's message and its fields, so that pushlb's lines
// are formatted, filtered and written by Caddy's logging like Caddy's own.
// Events are rare (list changes, drops, connection changes): decoding
// them costs nothing that matters.
type zapWriter struct {
	// logger returns the logger to write to, looked up at each event
	// (Caddy's default logger changes with the loaded config).
	logger func() *zap.Logger
}

// Write logs an event of unknown level at info.
func (w zapWriter) Write(p []byte) (int, error) {
	return w.WriteLevel(zerolog.NoLevel, p)
}

// WriteLevel logs one zerolog event at its level (zerolog.LevelWriter).
func (w zapWriter) WriteLevel(level zerolog.Level, p []byte) (int, error) {
	l := w.logger()
	zl := zapLevel(level)
	if !l.Core().Enabled(zl) {
		return len(p), nil
	}
	var fields map[string]any
	d := json.NewDecoder(bytes.NewReader(p))
	d.UseNumber()
	if err := d.Decode(&fields); err != nil {
		// Not an object: log the line as it is.
		if ce := l.Check(zl, string(bytes.TrimSpace(p))); ce != nil {
			ce.Write()
		}
		return len(p), nil
	}
	msg, _ := fields[zerolog.MessageFieldName].(string)
	delete(fields, zerolog.MessageFieldName)
	delete(fields, zerolog.LevelFieldName)
	delete(fields, zerolog.TimestampFieldName)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	zf := make([]zap.Field, 0, len(keys))
	for _, k := range keys {
		switch v := fields[k].(type) {
		case string:
			zf = append(zf, zap.String(k, v))
		case json.Number:
			if i, err := v.Int64(); err == nil {
				zf = append(zf, zap.Int64(k, i))
			} else if f, err := v.Float64(); err == nil {
				zf = append(zf, zap.Float64(k, f))
			} else {
				zf = append(zf, zap.String(k, v.String()))
			}
		default:
			zf = append(zf, zap.Any(k, v))
		}
	}
	if ce := l.Check(zl, msg); ce != nil {
		ce.Time = time.Now()
		ce.Write(zf...)
	}
	return len(p), nil
}

// zapLevel maps a zerolog level to zap's.
func zapLevel(l zerolog.Level) zapcore.Level {
	switch l {
	case zerolog.TraceLevel, zerolog.DebugLevel:
		return zapcore.DebugLevel
	case zerolog.WarnLevel:
		return zapcore.WarnLevel
	case zerolog.ErrorLevel:
		return zapcore.ErrorLevel
	case zerolog.FatalLevel, zerolog.PanicLevel:
		// pushlb never ends the process through its logger; Caddy's
		// logger must not either.
		return zapcore.ErrorLevel
	default:
		return zapcore.InfoLevel
	}
}

var _ zerolog.LevelWriter = zapWriter{}
