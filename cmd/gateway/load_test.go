package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/lbhttp"
)

// loadWorkers is the concurrency of the tests' steady load: at most the
// retries the gateway's default retry budget allows whatever the load
// (lbhttp.DefaultRetryBudget.MinConcurrent, checked by startLoad), so
// that the budget never refuses a retry and the tests' "no request
// fails" holds by construction. With 4, around a SIGKILL the 4 requests
// could all be retrying at once (those in flight to the killed instance
// reset, the next ones refused a connection until the advisory removed
// it), and the budget refused the 4th: a 502 "retry budget is spent".
const loadWorkers = 3

// load is a steady load through a gateway: a few clients, each sending a
// request, then the next on the tick of a 1 ms ticker (a steady stream,
// not a busy loop), until stopped. It counts the requests, their failures
// and the slowest, and records, per answering backend (the body's first
// word), the last answer's arrival.
type load struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	sent     atomic.Int64
	failed   atomic.Int64
	slowest  atomic.Int64 // ns
	firstErr atomic.Value // string: the first failure

	mu   sync.Mutex
	last map[string]time.Time
}

func startLoad(g *gw, workers int) *load {
	if workers > lbhttp.DefaultRetryBudget.MinConcurrent {
		panic(fmt.Sprintf("startLoad: %d workers, more than the %d retries the default retry budget always allows", workers, lbhttp.DefaultRetryBudget.MinConcurrent))
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel, last: map[string]time.Time{}}
	for range workers {
		l.wg.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				l.one(g)
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	return l
}

// one sends one request and records it.
func (l *load) one(g *gw) {
	began := time.Now()
	code, body, err := g.hit("/orders/")
	now := time.Now()
	took := int64(now.Sub(began))
	for old := l.slowest.Load(); took > old && !l.slowest.CompareAndSwap(old, took); old = l.slowest.Load() {
	}
	if err != nil || code != 200 {
		l.firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %q %v", code, body, err))
		l.failed.Add(1)
	} else {
		name, _, _ := strings.Cut(body, " ")
		l.mu.Lock()
		l.last[name] = now
		l.mu.Unlock()
	}
	l.sent.Add(1)
}

func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// counts returns the requests sent and failed so far.
func (l *load) counts() (sent, failed int) {
	return int(l.sent.Load()), int(l.failed.Load())
}

// first returns the first failure, "" when none.
func (l *load) first() string {
	s, _ := l.firstErr.Load().(string)
	return s
}

// lastFrom returns the arrival of the last answer from backend name.
func (l *load) lastFrom(name string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last[name]
}

// waitMore waits until n more requests were sent than now: the load went on
// past whatever happened before the call.
func (l *load) waitMore(t testing.TB, n int) {
	t.Helper()
	from := l.sent.Load()
	testutil.Eventually(t, fmt.Sprintf("%d more requests", n), func() bool { return l.sent.Load() >= from+int64(n) })
}

// waitAnswered waits until backend name has answered a request of the load
// after since.
func (l *load) waitAnswered(t testing.TB, name string, since time.Time) {
	t.Helper()
	testutil.Eventually(t, name+" to answer the load", func() bool { return l.lastFrom(name).After(since) })
}
