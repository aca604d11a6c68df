package pushlbcaddy_test

import (
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	pushlbcaddy "github.com/pushlb/pushlb/caddy"
)

// TestLogsGoThroughZap: each zerolog event becomes one zap entry at its
// level, with its message and fields; events below the zap logger's level
// are dropped before they are decoded.
func TestLogsGoThroughZap(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	zl := pushlbcaddy.ZerologTo(zap.New(core))
	zl.Debug().Msg("not shown")
	zl.Info().Str("service", "orders").Int("size", 3).Msg("server list changed")
	zl.Warn().Err(errors.New("EOF")).Msg("disconnected from NATS; reconnecting")
	zl.Error().Strs("join", []string{"a", "b"}).Float64("load", 0.5).Msg("failed")
	got := logs.AllUntimed()
	if len(got) != 3 {
		t.Fatalf("%d entries, want 3: %v", len(got), got)
	}
	want := []struct {
		level  zapcore.Level
		msg    string
		fields map[string]any
	}{
		{zapcore.InfoLevel, "server list changed", map[string]any{"service": "orders", "size": int64(3)}},
		{zapcore.WarnLevel, "disconnected from NATS; reconnecting", map[string]any{"error": "EOF"}},
		{zapcore.ErrorLevel, "failed", map[string]any{"join": []any{"a", "b"}, "load": 0.5}},
	}
	for i, w := range want {
		e := got[i]
		if e.Level != w.level || e.Message != w.msg {
			t.Errorf("entry %d: %v %q, want %v %q", i, e.Level, e.Message, w.level, w.msg)
		}
		fields := e.ContextMap()
		for k, v := range w.fields {
			if g, ok := fields[k]; !ok || !equal(g, v) {
				t.Errorf("entry %d: field %s = %#v, want %#v (all: %v)", i, k, g, v, fields)
			}
		}
		if _, ok := fields["level"]; ok {
			t.Errorf("entry %d keeps zerolog's level field: %v", i, fields)
		}
	}
}

func equal(a, b any) bool {
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok {
		if len(as) != len(bs) {
			return false
		}
		for i := range as {
			if as[i] != bs[i] {
				return false
			}
		}
		return true
	}
	return a == b
}
