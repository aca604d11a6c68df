package subscriber_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/pushlb/pushlb/subscriber"
)

func TestDropReasons(t *testing.T) {
	all := subscriber.AllDropReasons()
	var labels []string
	for _, r := range all {
		labels = append(labels, r.String())
	}
	want := []string{"malformed", "too_large", "bad_subject", "invalid", "mismatch", "version", "stale", "duplicate", "unsubscribed", "future", "limit", "other_region"}
	if !slices.Equal(labels, want) {
		t.Fatalf("labels %v, want %v", labels, want)
	}
	// The list is a copy: changing it changes nothing.
	all[0] = subscriber.DropStale
	if subscriber.AllDropReasons()[0] != subscriber.DropMalformed {
		t.Fatal("AllDropReasons returned shared state")
	}
	var st subscriber.Stats
	if len(st.Dropped) != len(want) {
		t.Fatalf("Dropped has %d counters for %d reasons", len(st.Dropped), len(want))
	}
	st.Dropped[subscriber.DropStale] = 3
	st.Dropped[subscriber.DropMalformed] = 1
	if st.Dropped.Total() != 4 {
		t.Fatalf("Total %d", st.Dropped.Total())
	}
	b, err := json.Marshal(st.Dropped)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]uint64
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || got["stale"] != 3 || got["malformed"] != 1 || got["duplicate"] != 0 {
		t.Fatalf("JSON %s", b)
	}
}
