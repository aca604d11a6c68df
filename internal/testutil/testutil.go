// Package testutil holds the few helpers the project's tests share.
package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 2 ms until it holds, and fails the test when
// it still does not after 20 s. Every wait in the tests is bounded by it.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// SyncBuffer is a bytes.Buffer that a process's output goroutines and the
// test may use at once.
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
