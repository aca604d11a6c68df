package commalist

import (
	"slices"
	"testing"
)

func TestSplit(t *testing.T) {
	for in, want := range map[string][]string{
		"":                      nil,
		" , ,":                  nil,
		"a":                     {"a"},
		" a , b,,c ":            {"a", "b", "c"},
		"nats://x:1,nats://y:2": {"nats://x:1", "nats://y:2"},
	} {
		if got := Split(in); !slices.Equal(got, want) {
			t.Errorf("Split(%q) = %q, want %q", in, got, want)
		}
	}
}
