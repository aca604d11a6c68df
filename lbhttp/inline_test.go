package lbhttp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
)

// rawServer is a TCP server on 127.0.0.1 whose connections are served by a
// script, for answers net/http's server would not give. It counts the
// connections it accepted; Close waits for every script to return.
type rawServer struct {
	ln       net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

// newRawServer serves each connection with serve, given the connection's
// number from 1 and a reader of its requests.
func newRawServer(t *testing.T, serve func(n int64, c net.Conn, br *bufio.Reader)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := s.accepted.Add(1)
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				serve(n, c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and its connections.
func (s *rawServer) Close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *rawServer) server(id string) balancer.Server {
	return serverAt(id, s.ln.Addr().String(), "")
}

// readRequest reads one request and its body; false at the end of the
// connection.
func readRequest(br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, req.Body)
	return true
}

// inlineTransport is a Transport with WithInlineHTTP1 over one server.
func inlineTransport(t *testing.T, cfg balancer.Config, srv balancer.Server) *Transport {
	t.Helper()
	lb := newBalancer(t, "svc", cfg, []balancer.Server{srv})
	return newTestTransport(t, BalancerMap{"svc": lb}, WithInlineHTTP1())
}

// get sends a GET through tr and returns the status and body.
func get(t *testing.T, tr http.RoundTripper, url string) (int, string, error) {
	t.Helper()
	resp, err := tr.RoundTrip(newRequest(t, "GET", url, nil))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func TestInlineReusesConnections(t *testing.T) {
	srv := newRawServer(t, func(_ int64, c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if req.Method == "HEAD" {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
				continue
			}
			// Chunked, with a trailer.
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"+
				"5\r\nchunk\r\n0\r\nX-Sum: 42\r\n\r\n")
		}
	})
	tr := inlineTransport(t, balancer.DefaultConfig(), srv.server("a"))
	for i := range 20 {
		resp, err := tr.RoundTrip(newRequest(t, "GET", "http://svc/x", nil))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "chunk" || resp.Trailer.Get("X-Sum") != "42" {
			t.Fatalf("request %d: %q, trailer %v, %v; want chunk and X-Sum 42", i, body, resp.Trailer, err)
		}
	}
	// A body read to its end keeps answering EOF, even once its
	// connection carries the next request.
	resp, err := tr.RoundTrip(newRequest(t, "GET", "http://svc/x", nil))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	if _, body, err := get(t, tr, "http://svc/x"); err != nil || body != "chunk" {
		t.Fatalf("GET = %q, %v", body, err)
	}
	if n, err := resp.Body.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Errorf("Read after EOF = %d, %v; want 0, EOF", n, err)
	}
	resp.Body.Close()
	head, err := tr.RoundTrip(newRequest(t, "HEAD", "http://svc/x", nil))
	if err != nil || head.Body != http.NoBody {
		t.Fatalf("HEAD: %v, body %T; want no body", err, head.Body)
	}
	if _, body, err := get(t, tr, "http://svc/x"); err != nil || body != "chunk" {
		t.Fatalf("GET after HEAD = %q, %v", body, err)
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections for 24 requests; want 1", n)
	}
}

func TestInlineLeavesOtherRequestsToNetHTTP(t *testing.T) {
	req := func(method string, body io.Reader, header ...string) *http.Request {
		r := newRequest(t, method, "http://127.0.0.1:1/", body)
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	bad := req("GET", nil)
	bad.Header["X Bad"] = []string{"1"}
	secure := req("GET", nil)
	secure.URL.Scheme = "https"
	for name, tc := range map[string]struct {
		req  *http.Request
		want bool
	}{
		"GET":              {req("GET", nil), true},
		"DELETE":           {req("DELETE", nil), true},
		"POST":             {req("POST", nil), false},
		"GET with a body":  {req("GET", strings.NewReader("x")), false},
		"PUT with a body":  {req("PUT", strings.NewReader("x")), false},
		"upgrade":          {req("GET", nil, "Connection", "Upgrade", "Upgrade", "websocket"), false},
		"https":            {secure, false},
		"invalid header":   {bad, false},
		"Idempotency-Key":  {req("PATCH", nil, "Idempotency-Key", "k"), false},
		"OPTIONS and HEAD": {req("OPTIONS", nil), true},
	} {
		if got := inlineEligible(tc.req); got != tc.want {
			t.Errorf("%s: inlineEligible = %v; want %v", name, got, tc.want)
		}
	}
}

// TestInlineRetriesConnectionClosedWhileIdle: the server takes the second
// request on a kept connection and closes it without an answer, as a
// server whose idle timeout ends just then does; the request is sent again
// on a new connection, and no attempt fails.
func TestInlineRetriesConnectionClosedWhileIdle(t *testing.T) {
	srv := newRawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
		for i := 0; readRequest(br); i++ {
			if n == 1 && i == 1 {
				return // closed, unanswered
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	var c counts
	lb := newBalancer(t, "svc", balancer.DefaultConfig(), []balancer.Server{srv.server("a")})
	tr := newTestTransport(t, BalancerMap{"svc": lb}, WithInlineHTTP1(), WithObserver(c.observer()))
	for i := range 3 {
		if status, body, err := get(t, tr, "http://svc/"); err != nil || status != 200 || body != "ok" {
			t.Fatalf("request %d = %d %q, %v; want 200 ok", i, status, body, err)
		}
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("%d connections; want 2 (the closed one replaced once)", n)
	}
	if n := c.retries.Load(); n != 0 {
		t.Errorf("%d retries; want none (a closed idle connection is not a failed attempt)", n)
	}
}

// TestInlineNeverReadsUnsolicitedBytes: a server that sends more than its
// response (a second response nobody asked for, as a smuggled request
// would make it) must not have those bytes read as the next request's
// answer, whether they arrive with the response or after it.
func TestInlineNeverReadsUnsolicitedBytes(t *testing.T) {
	const smuggled = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"
	for _, late := range []bool{false, true} {
		name := map[bool]string{false: "with the response", true: "after the response"}[late]
		t.Run(name, func(t *testing.T) {
			sent := make(chan struct{}, 1)
			srv := newRawServer(t, func(n int64, c net.Conn, br *bufio.Reader) {
				for readRequest(br) {
					if n > 1 {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
						continue
					}
					if late {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
						io.WriteString(c, smuggled)
					} else {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"+smuggled)
					}
					sent <- struct{}{}
				}
			})
			tr := inlineTransport(t, balancer.DefaultConfig(), srv.server("a"))
			if _, body, err := get(t, tr, "http://svc/"); err != nil || body != "first" {
				t.Fatalf("first = %q, %v", body, err)
			}
			<-sent
			if status, body, err := get(t, tr, "http://svc/"); err != nil || status != 200 || body != "real" {
				t.Fatalf("second = %d %q, %v; want the real answer on a new connection", status, body, err)
			}
			if n := srv.accepted.Load(); n != 2 {
				t.Errorf("%d connections; want 2", n)
			}
		})
	}
}

func TestInlineForwards1xx(t *testing.T) {
	srv := newRawServer(t, func(_ int64, c net.Conn, br *bufio.Reader) {
		for readRequest(br) {
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"+
				"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := inlineTransport(t, balancer.DefaultConfig(), srv.server("a"))
	front, client := newFront(t, tr)
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, h.Get("Link"))
		return nil
	}}
	req := newRequest(t, "GET", front.URL+"/svc/", nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" || len(hints) != 1 || hints[0] != "</style.css>; rel=preload" {
		t.Errorf("got %q after 1xx %q; want ok after one 103 with its Link", body, hints)
	}
}

func TestInlineCancelAndTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release) // before the backend closes
	b := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.Write([]byte("part"))
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	cfg := balancer.DefaultConfig()
	cfg.ReadTimeout = 100 * time.Millisecond
	cfg.MaxAutoRetriesNextServer = 0
	tr := inlineTransport(t, cfg, b.server(""))

	t.Run("read timeout", func(t *testing.T) {
		_, _, err := get(t, tr, "http://svc/")
		var e *Error
		if !errors.As(err, &e) || !e.Timeout() || !strings.Contains(err.Error(), "timeout awaiting response headers") {
			t.Fatalf("GET = %v; want the read timeout", err)
		}
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://svc/", nil)
		req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: cancel}))
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("RoundTrip = %v; want context.Canceled", err)
		}
	})
	t.Run("cancelled while streaming", func(t *testing.T) {
		cfg := cfg
		cfg.ReadTimeout = 10 * time.Second
		tr := inlineTransport(t, cfg, b.server(""))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://svc/stream", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 4)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatal(err)
		}
		cancel()
		if _, err := resp.Body.Read(buf); !errors.Is(err, context.Canceled) {
			t.Fatalf("Read after cancel = %v; want context.Canceled", err)
		}
	})
}

// TestInlineConnectionClose: a response with "Connection: close" ends its
// connection; the next request dials again.
func TestInlineConnectionClose(t *testing.T) {
	srv := newRawServer(t, func(_ int64, c net.Conn, br *bufio.Reader) {
		if readRequest(br) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye")
		}
	})
	tr := inlineTransport(t, balancer.DefaultConfig(), srv.server("a"))
	for range 3 {
		if _, body, err := get(t, tr, "http://svc/"); err != nil || body != "bye" {
			t.Fatalf("GET = %q, %v", body, err)
		}
	}
	if n := srv.accepted.Load(); n != 3 {
		t.Errorf("%d connections for 3 closing answers; want 3", n)
	}
}
