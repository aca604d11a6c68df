package natstest

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Link is a TCP proxy in front of a server whose connections can be
// frozen: from then on nothing gets through them, either way, and nothing
// closes them, as a client sees a dead link (a cable pulled, a NAT entry
// dropped) or a paused server (SIGSTOP, a VM suspended): a half-open
// connection that only the client's pings can reveal. Connections made
// after a freeze get through, so a client that gives its frozen connection
// up reconnects through the Link.
type Link struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by Close: the frozen pipes return
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	paused bool       // Pause: new connections are held, never answered
	held   []net.Conn // the connections accepted while paused
	pairs  []*linkPair
}

// linkPair is one client connection and its connection to the server.
type linkPair struct {
	client, server net.Conn
	frozen         atomic.Bool
}

// NewLink starts a Link to target (host:port) on a free port of
// 127.0.0.1. The test's cleanup closes it and every connection through it.
func NewLink(tb testing.TB, target string) *Link {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("natstest: link: %v", err)
	}
	l := &Link{ln: ln, target: target, done: make(chan struct{})}
	l.wg.Add(1)
	go l.accept()
	tb.Cleanup(l.Close)
	return l
}

// Addr is the address clients connect to.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// URL is the nats:// URL clients connect to.
func (l *Link) URL() string { return "nats://" + l.Addr() }

// Freeze stops every connection open through the link, both ways, without
// closing any; it returns how many it froze. Bytes that arrive on them
// afterwards are held, never delivered.
func (l *Link) Freeze() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, p := range l.pairs {
		if !p.frozen.Swap(true) {
			n++
		}
	}
	return n
}

// Pause freezes the link (Freeze) and holds the connections made from now
// on without ever answering them, as a paused server does (SIGSTOP: its
// kernel accepts connections, the server sends nothing): a client's
// connect times out, and it goes to another server of its cluster. It
// returns how many open connections it froze.
func (l *Link) Pause() int {
	l.mu.Lock()
	l.paused = true
	l.mu.Unlock()
	return l.Freeze()
}

// Resume lets new connections through again, as the server resumed
// (SIGCONT). The connections frozen or held meanwhile stay so: their
// clients gave them up.
func (l *Link) Resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.paused = false
}

// Close stops the link and closes every connection through it, frozen
// ones included, and waits for its goroutines. It is idempotent.
func (l *Link) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.done)
	l.ln.Close()
	for _, p := range l.pairs {
		p.client.Close()
		p.server.Close()
	}
	for _, c := range l.held {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		l.mu.Lock()
		if l.paused && !l.closed {
			l.held = append(l.held, c)
			l.mu.Unlock()
			continue
		}
		l.mu.Unlock()
		s, err := net.Dial("tcp", l.target)
		if err != nil {
			c.Close() // the server is down: the client sees a refusal
			continue
		}
		p := &linkPair{client: c, server: s}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		// Accepted before a Pause, dialled after its Freeze: frozen as if
		// it had been open then, or it would pass through a paused link.
		p.frozen.Store(l.paused)
		l.pairs = append(l.pairs, p)
		l.wg.Add(2)
		l.mu.Unlock()
		go l.pipe(p, s, c)
		go l.pipe(p, c, s)
	}
}

// pipe copies src to dst until either ends or the pair is frozen; a frozen
// pipe holds what it read and returns when the link closes.
func (l *Link) pipe(p *linkPair, dst, src net.Conn) {
	defer l.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.frozen.Load() {
			<-l.done
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				// One side ended: so does the other, as through a
				// real link.
				dst.Close()
				src.Close()
			}
			return
		}
	}
}
