package logx

import (
	"bytes"
	"strings"
	"testing"

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
