package lbhttp

import (
	"io"
	"sync"
	"sync/atomic"

	"github.com/pushlb/pushlb/balancer"
)

// bodyGuard wraps a request body that cannot be replayed (no GetBody), for
// one attempt. It records whether the attempt read from the body, and keeps
// the attempt's Close from closing the caller's body until the Transport
// knows it will not hand the body to another attempt: a dial that fails
// closes the request body, yet the body is intact and the next server may
// have it.
//
// Read is called by the attempt's transport only; Close and release may
// come from different goroutines (the transport may close the body after
// RoundTrip returned), hence the lock.
type bodyGuard struct {
	rc   io.ReadCloser
	read atomic.Bool
	// open counts the guards whose Close has not been called yet; it is
	// the Transport's, so tests can wait until every attempt's transport
	// is done with its body.
	open *atomic.Int64

	mu       sync.Mutex
	closed   bool // the attempt's transport called Close
	released bool // the body is no longer ours to keep: Close closes rc
	done     bool // rc has been closed
}

func newBodyGuard(rc io.ReadCloser, open *atomic.Int64) *bodyGuard {
	open.Add(1)
	return &bodyGuard{rc: rc, open: open}
}

// Read reads from the wrapped body and notes that it was touched.
func (g *bodyGuard) Read(p []byte) (int, error) {
	g.read.Store(true)
	return g.rc.Read(p)
}

// Close closes the wrapped body once it is released; until then it only
// notes the call.
func (g *bodyGuard) Close() error {
	g.mu.Lock()
	first := !g.closed
	g.closed = true
	closeNow := g.released && !g.done
	if closeNow {
		g.done = true
	}
	g.mu.Unlock()
	var err error
	if closeNow {
		err = g.rc.Close()
	}
	if first {
		g.open.Add(-1)
	}
	return err
}

// release gives the body up: it is closed now if the attempt already closed
// the guard, or when it does.
func (g *bodyGuard) release() {
	g.mu.Lock()
	g.released = true
	closeNow := g.closed && !g.done
	if closeNow {
		g.done = true
	}
	g.mu.Unlock()
	if closeNow {
		g.rc.Close()
	}
}

// untouched reports whether the attempt never read from the body.
func (g *bodyGuard) untouched() bool { return !g.read.Load() }

// activeBody wraps a response body so that the request stays active in the
// server's stats until the body is read to its end or closed, whichever
// comes first: streaming responses (SSE, downloads) count as load. The
// response was already recorded with Pick.Responded; the body ends the
// pick once.
type activeBody struct {
	io.ReadCloser
	pick  balancer.Pick
	ended atomic.Bool
}

// Read reads from the body and ends the request at EOF or on an error.
func (b *activeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end()
	}
	return n, err
}

// Close closes the body and ends the request.
func (b *activeBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

func (b *activeBody) end() {
	if b.ended.CompareAndSwap(false, true) {
		b.pick.End()
	}
}

var (
	_ io.ReadCloser = (*bodyGuard)(nil)
	_ io.ReadCloser = (*activeBody)(nil)
)
