package events

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProtocolDocExamples keeps docs/protocol.md honest: every JSON event
// example in it must decode.
func TestProtocolDocExamples(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(doc), "```json\n")[1:]
	events := 0
	for _, b := range blocks {
		payload, _, ok := strings.Cut(b, "```")
		if !ok {
			t.Fatalf("unterminated json block: %.40q", b)
		}
		if strings.Contains(payload, `"host"`) || strings.Contains(payload, `"gateway"`) {
			continue // a registry value or a convergence report, not an event
		}
		events++
		if _, err := Decode([]byte(payload)); err != nil {
			t.Errorf("example %s does not decode: %v", strings.TrimSpace(payload), err)
		}
	}
	if events < 2 {
		t.Errorf("found %d event examples in docs/protocol.md, want at least 2", events)
	}
}
