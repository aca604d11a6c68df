package lbhttp

import (
	"net/http"
	"strconv"
)

// flushWriter is the ResponseWriter the Proxy hands to ReverseProxy. A
// response of known length is flushed after each write that leaves it
// incomplete, so a body that arrives in parts reaches the client part by
// part, and not after the write that completes it: the handler's return
// sends what remains, so the headers and a body read in one piece leave in
// one write (ReverseProxy's FlushInterval -1 flushes the headers alone from
// a timer goroutine, then the body: two writes and a wake-up per
// response). Responses of unknown length and event streams are flushed by
// ReverseProxy itself after every write.
type flushWriter struct {
	http.ResponseWriter
	length  int64 // the response's Content-Length; -1: unknown or no body
	written int64
	header  bool // WriteHeader was called with a final status
}

// WriteHeader reads the response's length from its Content-Length header.
func (f *flushWriter) WriteHeader(code int) {
	if code >= 200 && !f.header {
		f.header = true
		f.length = -1
		if cl := f.Header().Get("Content-Length"); cl != "" {
			if n, err := strconv.ParseInt(cl, 10, 64); err == nil {
				f.length = n
			}
		}
	}
	f.ResponseWriter.WriteHeader(code)
}

// Write writes p and flushes when the body is not complete yet.
func (f *flushWriter) Write(p []byte) (int, error) {
	if !f.header {
		f.WriteHeader(http.StatusOK)
	}
	n, err := f.ResponseWriter.Write(p)
	f.written += int64(n)
	if err == nil && f.length > 0 && f.written < f.length {
		err = http.NewResponseController(f.ResponseWriter).Flush()
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the server's ResponseWriter
// (Flush, Hijack for upgrades, deadlines).
func (f *flushWriter) Unwrap() http.ResponseWriter { return f.ResponseWriter }

var _ http.ResponseWriter = (*flushWriter)(nil)
