package subscriber

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestReofferCancelsTheBackoff: a list deferred six times waits 3.2 s for
// its next offer; Reoffer cancels that wait and delivers it at once. A
// service that waits for nothing is left alone.
func TestReofferCancelsTheBackoff(t *testing.T) {
	sent := make(chan string, 4)
	var wg sync.WaitGroup
	sc := &scheduler{ctx: t.Context(), wg: &wg, log: zerolog.Nop(), handlerErrors: new(atomic.Uint64),
		svcs: map[string]*svcState{}, send: func(service string) (bool, error) { sent <- service; return true, nil }}
	defer wg.Wait()
	defer sc.stop()
	sc.start(nil)
	sc.mu.Lock()
	sc.stateLocked("orders").failures = 6
	sc.mu.Unlock()
	sc.mark("orders", true)
	waiting := func() (timer bool, failures int) {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		st := sc.svcs["orders"]
		return st.timer != nil, st.failures
	}
	if timer, _ := waiting(); !timer {
		t.Fatal("a deferred list does not wait for its backoff")
	}

	sc.reoffer("orders")
	if timer, failures := waiting(); timer || failures != 0 {
		t.Fatalf("after Reoffer: waiting %v, failures %d; want neither", timer, failures)
	}
	if got := testutil.Receive(t, sent, 10*time.Second, "the reoffered list"); got != "orders" {
		t.Fatalf("delivered %q", got)
	}
	sc.reoffer("payments")
	sc.mu.Lock()
	_, made := sc.svcs["payments"]
	sc.mu.Unlock()
	if made {
		t.Fatal("Reoffer of a service with no delivery state made one")
	}
}
