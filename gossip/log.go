package gossip

import (
	"strings"

	"github.com/rs/zerolog"
)

// logWriter turns memberlist's log lines ("[DEBUG] memberlist: text") into
// zerolog debug events. memberlist's levels are kept in a field rather than
// mapped: it logs expected things, such as failed pings to a node that just
// crashed, as errors.
type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	e := w.log.Debug() // nil when debug is off
	if e == nil {
		return len(p), nil
	}
	line := strings.TrimRight(string(p), "\r\n")
	level := ""
	if strings.HasPrefix(line, "[") {
		if i := strings.IndexByte(line, ']'); i > 0 {
			level = line[1:i]
			line = strings.TrimSpace(line[i+1:])
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	e.Str("memberlist_level", level).Msg(line)
	return len(p), nil
}
