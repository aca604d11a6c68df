package testutil

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// DefaultTimeout bounds Eventually: long enough for a loaded 2-core
// machine, short enough that a hang fails well before go test's own
// timeout.
const DefaultTimeout = 20 * time.Second

// pollInterval is the pause between two checks of an Eventually condition.
const pollInterval = 2 * time.Millisecond

// Eventually polls cond every 2 ms until it holds, and fails the test when
// it still does not after DefaultTimeout (20 s).
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	EventuallyWithin(tb, DefaultTimeout, what, cond)
}

// EventuallyWithin polls cond every 2 ms until it holds, and fails the test
// when it still does not after timeout. cond runs at least once.
func EventuallyWithin(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pollInterval) // the poll interval: the one sleep tests may use
	}
}

// Receive returns the next value from ch, or the zero value once ch is
// closed, and fails the test when neither happens within timeout.
func Receive[T any](tb testing.TB, ch <-chan T, timeout time.Duration, what string) T {
	tb.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case v := <-ch:
		return v
	case <-t.C:
		tb.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
	var zero T
	return zero
}

// SyncBuffer is a bytes.Buffer that a process's output goroutines and the
// test may use at once. The zero value is ready to use.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Rand is a seeded source of the balancer's randomness (balancer.Rand)
// that is safe for concurrent use, for tests whose picks must repeat.
type Rand struct {
	mu sync.Mutex
	r  *rand.Rand
}

// NewRand returns a Rand over math/rand/v2's PCG seeded with seed1 and
// seed2.
func NewRand(seed1, seed2 uint64) *Rand { return &Rand{r: rand.New(rand.NewPCG(seed1, seed2))} }

// IntN returns a number in [0, n).
func (l *Rand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

// Float64 returns a number in [0, 1).
func (l *Rand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// Exactly reports whether seen (counts by name: the backend that answered,
// the address an RPC reached) counts each of want at least once and
// nothing else.
func Exactly(seen map[string]int, want []string) bool {
	n := 0
	for _, w := range want {
		if seen[w] == 0 {
			return false
		}
		n += seen[w]
	}
	for _, v := range seen {
		n -= v
	}
	return n == 0
}
