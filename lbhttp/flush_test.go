package lbhttp

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// countingListener counts the writes on the connections it accepts.
type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &l.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestProxyAnswersInOneWrite checks that a short response of known length
// reaches the client in one write, headers and body together, while a
// longer one that arrives in parts is flushed part by part
// (TestProxyStreamsResponses).
func TestProxyAnswersInOneWrite(t *testing.T) {
	orders := newBackend(t, "orders-1", nil)
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{orders.server("")})})
	p, err := NewProxy(tr)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewUnstartedServer(p)
	ln := &countingListener{Listener: front.Listener}
	front.Listener = ln
	front.Start()
	const requests = 5
	for range requests {
		code, body, err := testutil.Fetch(front.Client(), front.URL+"/orders/x")
		if err != nil || code != 200 || !strings.HasPrefix(body, "orders-1") {
			t.Fatalf("%d %q %v", code, body, err)
		}
	}
	front.Client().CloseIdleConnections()
	front.Close() // waits for the handlers: every write is counted
	if n := ln.writes.Load(); n != requests {
		t.Errorf("%d writes for %d responses, want one each", n, requests)
	}
}

// TestFlushWriterLength checks which writes flush.
func TestFlushWriterLength(t *testing.T) {
	tests := []struct {
		name    string
		length  string
		parts   []string
		flushes int
	}{
		{"one piece", "5", []string{"hello"}, 0},
		{"in parts", "5", []string{"he", "ll", "o"}, 2},
		{"unknown length", "", []string{"he", "llo"}, 0}, // ReverseProxy flushes these
		{"bad length", "x", []string{"he", "llo"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
			if tc.length != "" {
				rec.Header().Set("Content-Length", tc.length)
			}
			f := &flushWriter{ResponseWriter: rec}
			f.WriteHeader(http.StatusOK)
			for _, p := range tc.parts {
				if _, err := f.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			if rec.flushes != tc.flushes {
				t.Errorf("%d flushes, want %d", rec.flushes, tc.flushes)
			}
			if http.NewResponseController(f).Flush(); rec.flushes != tc.flushes+1 {
				t.Error("ResponseController does not reach the server's Flush")
			}
		})
	}
}

type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++ }
