package subscriber_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/subscriber"
)

// TestStartBatchIsBounded: the services the registry holds at Start are
// each delivered once, by at most StartWorkers handlers at a time (all at
// once, each holding its lookups and its new servers, they made the
// gateway's heap peak at start); a service registered meanwhile is
// delivered as well.
func TestStartBatchIsBounded(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	reg := openRegistry(t, nc)
	workers := subscriber.StartWorkers()
	n := 3 * workers
	for s := range n {
		if _, err := reg.Register(t.Context(), instance(fmt.Sprintf("svc-%d", s), 1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	var mu sync.Mutex
	inFlight, most := 0, 0
	delivered := map[string]int{}
	sub, err := subscriber.New(nc, reg, func(ctx context.Context, lc events.ListChanged) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
		}
		mu.Lock()
		inFlight--
		delivered[lc.Service]++
		mu.Unlock()
		return nil
	}, subscriber.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	read := func() (int, int, int) {
		mu.Lock()
		defer mu.Unlock()
		return inFlight, most, len(delivered)
	}
	// The workers are all busy: the rest of the batch waits for them.
	testutil.Eventually(t, "every start worker to run a delivery", func() bool {
		in, _, _ := read()
		return in == workers
	})
	close(release)
	testutil.Eventually(t, "every service to be delivered", func() bool {
		_, _, d := read()
		return d == n
	})
	if _, m, _ := read(); m > workers {
		t.Errorf("%d deliveries of start's batch ran at once, want at most %d", m, workers)
	}
	mu.Lock()
	defer mu.Unlock()
	for svc, c := range delivered {
		if c != 1 {
			t.Errorf("%s delivered %d times, want once", svc, c)
		}
	}
}
