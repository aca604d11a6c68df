package expiry_test

import (
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/base/expiry"
)

func TestSet(t *testing.T) {
	now := time.Unix(1000, 0)
	s := expiry.New(3)
	s.Add("a", now.Add(time.Second), now)
	if !s.Has("a", now) || s.Has("b", now) {
		t.Fatal("a key added is held, another is not")
	}
	if s.Has("a", now.Add(2*time.Second)) || s.Len() != 0 {
		t.Fatal("an expired key is held")
	}
	// Full: the expired keys go first.
	s.Add("old", now, now)
	s.Add("b", now.Add(time.Hour), now)
	s.Add("c", now.Add(time.Hour), now)
	s.Add("d", now.Add(time.Hour), now.Add(time.Minute))
	if s.Len() != 3 || s.Has("old", now.Add(time.Minute)) || !s.Has("b", now.Add(time.Minute)) {
		t.Fatalf("full with one expired key: %d keys", s.Len())
	}
	// Full without an expired key: a fresh start.
	s.Add("e", now.Add(time.Hour), now.Add(time.Minute))
	if s.Len() != 1 || !s.Has("e", now.Add(time.Minute)) {
		t.Fatalf("full with none expired: %d keys", s.Len())
	}
}
