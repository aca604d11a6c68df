package gateway

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/subscriber"
)

// readConfigDoc returns docs/config.md.
func readConfigDoc(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// section returns the part of doc from the heading to the next heading of
// any level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/config.md has no heading %q", heading)
	}
	if i := strings.Index(rest, "\n#"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// jsonKeys returns the JSON keys of t's fields, nested structs, slices,
// pointers and map values included. Map keys and types with their own
// encoding (times, the drop counts keyed by reason) hold values, not keys.
func jsonKeys(t reflect.Type, seen map[reflect.Type]bool, keys map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		if t.Implements(reflect.TypeFor[json.Marshaler]()) {
			return
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] || t.Implements(reflect.TypeFor[json.Marshaler]()) ||
		reflect.PointerTo(t).Implements(reflect.TypeFor[json.Marshaler]()) {
		return
	}
	seen[t] = true
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			if f.Anonymous {
				jsonKeys(f.Type, seen, keys)
				continue
			}
			name = f.Name
		}
		keys[name] = true
		jsonKeys(f.Type, seen, keys)
	}
}

// TestDocsListEveryJSONKey: every key of /-/lb's JSON (and of the
// per-service summary of /-/lb/events) is named in docs/config.md's
// "JSON keys" section, so a new counter cannot go undocumented.
func TestDocsListEveryJSONKey(t *testing.T) {
	doc := section(t, readConfigDoc(t), "### JSON keys")
	keys := map[string]bool{}
	seen := map[reflect.Type]bool{}
	jsonKeys(reflect.TypeFor[State](), seen, keys)
	jsonKeys(reflect.TypeFor[ServiceSummary](), seen, keys)
	var missing []string
	for k := range keys {
		if !strings.Contains(doc, "`"+k+"`") {
			missing = append(missing, k)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("docs/config.md's JSON keys section lacks %d keys: %s", len(missing), strings.Join(missing, ", "))
	}
}

// TestDocsListEveryDropReason: the metrics table names every reason of
// pushlb_events_dropped_total, as the code declares them.
func TestDocsListEveryDropReason(t *testing.T) {
	row := regexp.MustCompile("(?m)^\\| `pushlb_events_dropped_total` \\|.*$").FindString(readConfigDoc(t))
	if row == "" {
		t.Fatal("docs/config.md has no row for pushlb_events_dropped_total")
	}
	for _, r := range subscriber.AllDropReasons() {
		if !regexp.MustCompile(`\b` + r.String() + `\b`).MatchString(row) {
			t.Errorf("the pushlb_events_dropped_total row lacks the reason %q: %s", r, row)
		}
	}
}
