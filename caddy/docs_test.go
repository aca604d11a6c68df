package pushlbcaddy_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocSnippetIsTheExample: the site block docs/caddy.md shows after its
// link to example.Caddyfile is the file's site block, line for line, so
// that what a reader copies is what TestExampleCaddyfile runs (its bind to
// loopback included).
func TestDocSnippetIsTheExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/caddy.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "[`caddy/example.Caddyfile`]")
	if !ok {
		t.Fatal("docs/caddy.md does not link caddy/example.Caddyfile")
	}
	_, rest, ok = strings.Cut(rest, "```caddyfile\n")
	if !ok {
		t.Fatal("docs/caddy.md: no caddyfile block after the link to example.Caddyfile")
	}
	snippet, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/caddy.md: the example's caddyfile block does not end")
	}
	i := strings.Index(string(example), "\nhttp://")
	if i < 0 {
		t.Fatal("example.Caddyfile has no http:// site block")
	}
	site := strings.TrimSpace(string(example[i:]))
	if got := strings.TrimSpace(snippet); got != site {
		t.Fatalf("docs/caddy.md's snippet differs from example.Caddyfile's site block.\ndocs/caddy.md:\n%s\n\nexample.Caddyfile:\n%s", got, site)
	}
}
