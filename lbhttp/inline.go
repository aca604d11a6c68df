package lbhttp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"
)

// inlinePool is the HTTP/1.1 client of WithInlineHTTP1: it writes a
// request and reads its response on the caller's goroutine, over a pool of
// keep-alive connections per server address. net/http's Transport hands
// each request to its connection's writer goroutine and the response back
// from its reader goroutine (four goroutine wake-ups per request, a tenth
// of a gateway's CPU); this client has no goroutine of its own.
//
// It serves only what it can serve as net/http would (see inlineEligible):
// requests without a body, with an idempotent method, no protocol upgrade,
// to plain-HTTP servers. The response is read by net/http's own parser
// (http.ReadResponse: the same framing, Content-Length and chunked checks
// and trailers as the Transport). 1xx answers go to the request's
// httptrace Got1xxResponse hook, as the Transport does; other httptrace
// hooks are not called.
//
// A connection goes back to the pool once its response body has been read
// to its end, unless either side asked to close it or the server sent
// bytes beyond the response. Before an idle connection is reused, a
// non-blocking peek makes sure the server has neither closed it nor sent
// anything unasked (see connIdle); a reused connection that still fails
// before the first byte of the response (the server closed it meanwhile)
// is replaced by a new one and the request sent again, which its
// idempotent method allows, as net/http does.
//
// Threading: roundTrip and closeIdle may be called from any goroutine; the
// pool's lock guards only the idle lists.
type inlinePool struct {
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	read        time.Duration // response-header timeout; 0: none
	maxIdle     int           // idle connections kept per address
	idleTimeout time.Duration

	mu        sync.Mutex
	idle      map[string][]*inlineConn // by address, most recently used last
	lastSweep time.Time
}

// inlineConn is one connection of an inlinePool, with its buffers.
type inlineConn struct {
	addr      string
	conn      net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
}

// max1xxResponses is how many 1xx answers a request may get before its
// final one, as net/http allows.
const max1xxResponses = 5

func newInlinePool(dial func(context.Context, string, string) (net.Conn, error), read time.Duration) *inlinePool {
	return &inlinePool{
		dial:        dial,
		read:        read,
		maxIdle:     defaultMaxIdleConnsPerHost,
		idleTimeout: defaultIdleConnTimeout,
		idle:        make(map[string][]*inlineConn),
	}
}

// inlineEligible reports whether req may go through an inlinePool: no
// body, an idempotent method (so a request on a connection the server
// closed meanwhile may be sent again), no upgrade, plain HTTP, and header
// names that are tokens (net/http's Transport refuses others).
func inlineEligible(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody || req.URL.Scheme != "http" || req.Close {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
	default:
		return false
	}
	if _, ok := req.Header["Upgrade"]; ok {
		return false
	}
	for k := range req.Header {
		if !validHeaderName(k) {
			return false
		}
	}
	return true
}

// roundTrip sends req (inlineEligible) to req.URL.Host and returns the
// response, whose body must be read to its end or closed.
func (p *inlinePool) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pc, reused, err := p.get(ctx, req.URL.Host)
		if err != nil {
			return nil, err
		}
		resp, err := p.exchange(ctx, pc, reused, req)
		if err == nil {
			return resp, nil
		}
		if reused && errors.Is(err, errConnClosedIdle) {
			continue
		}
		return nil, err
	}
}

// errConnClosedIdle is the failure of a reused connection before any byte
// of the response: the server closed it while idle.
var errConnClosedIdle = errors.New("lbhttp: server closed idle connection")

// exchange sends req on pc and reads the response headers. On an error, pc
// is closed; the error of a reused connection that failed before the first
// byte of the response wraps errConnClosedIdle.
func (p *inlinePool) exchange(ctx context.Context, pc *inlineConn, reused bool, req *http.Request) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { pc.conn.Close() })
	fail := func(err error, beforeResponse bool) (*http.Response, error) {
		stop()
		pc.conn.Close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if isTimeout(err) {
			return nil, fmt.Errorf("lbhttp: timeout awaiting response headers: %w", err)
		}
		if reused && beforeResponse {
			return nil, fmt.Errorf("%w: %w", errConnClosedIdle, err)
		}
		return nil, err
	}
	if err := req.Write(pc.bw); err != nil {
		return fail(err, true)
	}
	if err := pc.bw.Flush(); err != nil {
		return fail(err, true)
	}
	if p.read > 0 {
		pc.conn.SetReadDeadline(time.Now().Add(p.read))
	}
	if _, err := pc.br.Peek(1); err != nil {
		return fail(err, true)
	}
	var resp *http.Response
	for n := 0; ; n++ {
		var err error
		resp, err = http.ReadResponse(pc.br, req)
		if err != nil {
			return fail(err, false)
		}
		if resp.StatusCode >= 200 {
			break
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return fail(errors.New("lbhttp: 101 Switching Protocols for a request without Upgrade"), false)
		}
		if n == max1xxResponses {
			return fail(errors.New("lbhttp: too many 1xx informational responses"), false)
		}
		if trace := httptrace.ContextClientTrace(ctx); trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
				return fail(err, false)
			}
		}
	}
	if p.read > 0 {
		pc.conn.SetReadDeadline(time.Time{})
	}
	b := &inlineBody{p: p, pc: pc, body: resp.Body, ctx: ctx, stop: stop, keep: !resp.Close}
	if resp.Body == nil || resp.Body == http.NoBody {
		b.finish(true)
		return resp, nil
	}
	resp.Body = b
	return resp, nil
}

// inlineBody is a response body of an inlinePool. Its end gives the
// connection back to the pool (read to EOF) or closes it (closed early, an
// error, the request cancelled). Read is called by one goroutine; Close
// may come from another.
type inlineBody struct {
	p    *inlinePool
	pc   *inlineConn
	body io.ReadCloser // http.ReadResponse's
	ctx  context.Context
	stop func() bool // stops the cancellation hook
	keep bool        // neither side asked to close the connection
	done atomic.Bool
	eof  atomic.Bool // read to its end: Read keeps returning io.EOF
}

// Read reads from the response; at its end the connection is released.
func (b *inlineBody) Read(p []byte) (int, error) {
	if b.done.Load() {
		if b.eof.Load() {
			return 0, io.EOF
		}
		return 0, errors.New("lbhttp: read on closed response body")
	}
	n, err := b.body.Read(p)
	switch {
	case err == io.EOF:
		b.eof.Store(true)
		b.finish(true)
	case err != nil:
		if ctxErr := b.ctx.Err(); ctxErr != nil {
			err = ctxErr
		}
		b.finish(false)
	}
	return n, err
}

// Close ends the response; a body not read to its end closes the
// connection rather than draining it (a stream may never end).
func (b *inlineBody) Close() error {
	b.finish(false)
	return nil
}

// finish releases the connection once: to the pool when the response was
// read whole and the connection may be reused, else closed.
func (b *inlineBody) finish(whole bool) {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	if b.stop() && whole && b.keep {
		b.p.put(b.pc)
		return
	}
	b.pc.conn.Close()
}

// get returns an idle connection to addr that is still usable, or a new
// one; reused tells which.
func (p *inlinePool) get(ctx context.Context, addr string) (pc *inlineConn, reused bool, err error) {
	now := time.Now()
	for {
		p.mu.Lock()
		list := p.idle[addr]
		n := len(list)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		pc = list[n-1]
		list[n-1] = nil
		p.idle[addr] = list[:n-1]
		p.mu.Unlock()
		if now.Sub(pc.idleSince) < p.idleTimeout && connIdle(pc.conn) {
			return pc, true, nil
		}
		pc.conn.Close()
	}
	conn, err := p.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	return &inlineConn{addr: addr, conn: conn, br: bufio.NewReader(conn), bw: bufio.NewWriter(conn)}, false, nil
}

// put keeps pc for the next request to its address, unless the server
// sent more than the response (a framing error or a smuggling attempt:
// those bytes must never be read as the next response) or enough
// connections to the address are idle. Connections idle for longer than
// the idle timeout, to any address, are closed on the way, at most once
// per half idle timeout.
func (p *inlinePool) put(pc *inlineConn) {
	if pc.br.Buffered() > 0 {
		pc.conn.Close()
		return
	}
	now := time.Now()
	pc.idleSince = now
	var expired []*inlineConn
	p.mu.Lock()
	list := p.idle[pc.addr]
	kept := len(list) < p.maxIdle
	if kept {
		p.idle[pc.addr] = append(list, pc)
	}
	if now.Sub(p.lastSweep) >= p.idleTimeout/2 {
		p.lastSweep = now
		expired = p.removeIdle(func(c *inlineConn) bool { return now.Sub(c.idleSince) >= p.idleTimeout })
	}
	p.mu.Unlock()
	if !kept {
		pc.conn.Close()
	}
	for _, c := range expired {
		c.conn.Close()
	}
}

// closeIdle closes every idle connection. The pool stays usable.
func (p *inlinePool) closeIdle() {
	p.mu.Lock()
	idle := p.removeIdle(func(*inlineConn) bool { return true })
	p.mu.Unlock()
	for _, c := range idle {
		c.conn.Close()
	}
}

// removeIdle takes the idle connections drop selects out of the lists and
// returns them. The caller holds p.mu.
func (p *inlinePool) removeIdle(drop func(*inlineConn) bool) []*inlineConn {
	var out []*inlineConn
	for addr, list := range p.idle {
		kept := list[:0]
		for _, c := range list {
			if drop(c) {
				out = append(out, c)
			} else {
				kept = append(kept, c)
			}
		}
		clear(list[len(kept):])
		if len(kept) == 0 {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = kept
		}
	}
	return out
}

// validHeaderName reports whether name is an HTTP token (RFC 9110 section
// 5.6.2), as a header field name must be.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' ||
			c == '+' || c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return true
}

var _ io.ReadCloser = (*inlineBody)(nil)
