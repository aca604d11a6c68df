package logx

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestJSONWhenNotATerminal(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, zerolog.InfoLevel)
	log.Debug().Msg("hidden")
	log.Info().Str("k", "v").Msg("shown")
	if out := b.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"k":"v"`) || !strings.Contains(out, `"time"`) {
		t.Fatalf("output %q", out)
	}
}

// Every line's time has milliseconds (both binaries log through New), in
// a child logger's too, whatever zerolog's process-wide TimeFieldFormat
// (whole seconds by default): a crash and the removal it causes are
// milliseconds apart.
func TestTimestampsHaveMilliseconds(t *testing.T) {
	var b bytes.Buffer
	log := New(&b, zerolog.InfoLevel).With().Str("cmd", "x").Logger()
	log.Info().Msg("one")
	var line struct{ Time string }
	if err := json.Unmarshal(b.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, b.String())
	}
	at, err := time.Parse(TimeFormat, line.Time)
	if err != nil {
		t.Fatalf("time %q is not in %s: %v", line.Time, TimeFormat, err)
	}
	if since := time.Since(at); since < 0 || since > time.Minute {
		t.Errorf("time %q is not now", line.Time)
	}
	if dot := strings.LastIndexByte(line.Time, '.'); dot < 0 || len(line.Time) < dot+4 {
		t.Errorf("time %q has no milliseconds", line.Time)
	}
}
