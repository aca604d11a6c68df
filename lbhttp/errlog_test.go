package lbhttp

import (
	"strconv"
	"testing"
	"time"
)

// TestErrorLogForgetsQuietUpstreams: the limiter's memory stays bounded
// however many upstreams fail; upstreams quiet for an interval go first,
// and a forgotten upstream's next failure is logged.
func TestErrorLogForgetsQuietUpstreams(t *testing.T) {
	l := newErrorLog()
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for i := range maxErrorLogKeys {
		if ok, _ := l.allow(errorLogKey{service: "s" + strconv.Itoa(i)}); !ok {
			t.Fatalf("first failure of upstream %d not logged", i)
		}
	}
	now = now.Add(errorLogInterval)
	if ok, _ := l.allow(errorLogKey{service: "new"}); !ok {
		t.Fatal("a new upstream's first failure not logged")
	}
	if len(l.last) != 1 {
		t.Fatalf("%d upstreams remembered, want only the new one", len(l.last))
	}
	if ok, folded := l.allow(errorLogKey{service: "s0"}); !ok || folded != 0 {
		t.Fatalf("a forgotten upstream's failure: logged %v, folded %d", ok, folded)
	}
}
