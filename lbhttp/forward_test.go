package lbhttp

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/balancer"
)

// TestForwardMatchesReverseProxy sends the same requests through the
// Proxy's own forwarding and through httputil.ReverseProxy with the same
// Rewrite, and compares what the backend and the client see: the request
// line and headers (hop-by-hop fields, X-Forwarded-*, Te, User-Agent), the
// status, headers, body, trailers and 1xx answers of the response.
func TestForwardMatchesReverseProxy(t *testing.T) {
	b := newBackend(t, "a", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		switch r.URL.Path {
		case "/hop":
			h.Set("Connection", "X-Resp")
			h.Set("X-Resp", "dropped")
			h.Set("Keep-Alive", "timeout=5")
			h.Set("X-Kept", "kept")
			h.Add("X-Multi", "1")
			h.Add("X-Multi", "2")
		case "/trailer":
			h.Set("Trailer", "X-Sum")
			io.WriteString(w, "body")
			h.Set("X-Sum", "42")
			return
		case "/undeclared-trailer":
			io.WriteString(w, "body")
			w.(http.Flusher).Flush()
			h.Set(http.TrailerPrefix+"X-Late", "late")
			return
		case "/sse":
			h.Set("Content-Type", "text/event-stream; charset=utf-8")
			io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
			io.WriteString(w, "data: 2\n\n")
			return
		case "/early":
			h.Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			h.Del("Link")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
			return
		}
		io.WriteString(w, r.Method+" "+r.URL.RequestURI())
	})
	lb := newBalancer(t, "svc", balancer.DefaultConfig(), []balancer.Server{b.server("")})
	p, err := NewProxy(newTestTransport(t, BalancerMap{"svc": lb}))
	if err != nil {
		t.Fatal(err)
	}
	lean := httptest.NewServer(p)
	t.Cleanup(lean.Close)
	reference := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.rp.ServeHTTP(&flushWriter{ResponseWriter: w}, r)
	}))
	t.Cleanup(reference.Close)

	type view struct {
		Status    int
		Header    http.Header
		Body      string
		Trailer   http.Header
		Informed  []string
		Backend   seen
		BackendOK bool
	}
	do := func(t *testing.T, front *httptest.Server, method, target, body string, header http.Header) view {
		t.Helper()
		var v view
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req := newRequest(t, method, front.URL+target, rd)
		for k, vv := range header {
			req.Header[k] = vv
		}
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			v.Informed = append(v.Informed, h.Get("Link"))
			return nil
		}}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
		client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
		defer client.CloseIdleConnections()
		b.last.Store(nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		v.Status, v.Body, v.Trailer = resp.StatusCode, string(data), resp.Trailer
		v.Header = resp.Header.Clone()
		v.Header.Del("Date")
		if s := b.last.Load(); s != nil {
			v.Backend, v.BackendOK = *s, true
			if h := v.Backend.Header; h.Get("X-Forwarded-Host") == front.Listener.Addr().String() {
				h.Set("X-Forwarded-Host", "the front")
			}
		}
		return v
	}
	hop := http.Header{
		"Connection":        {"X-Hop, Keep-Alive"},
		"X-Hop":             {"dropped"},
		"Keep-Alive":        {"timeout=5"},
		"Te":                {"trailers, deflate"},
		"Proxy-Connection":  {"keep-alive"},
		"Forwarded":         {"for=1.2.3.4"},
		"X-Forwarded-For":   {"1.2.3.4"},
		"X-Forwarded-Host":  {"evil"},
		"X-Forwarded-Proto": {"https"},
		"X-Real-Ip":         {"1.2.3.4"},
		"X-Multi":           {"a", "b"},
	}
	for _, tc := range []struct {
		name, method, target, body string
		header                     http.Header
	}{
		{"GET", "GET", "/svc/x?q=1&r=%41", "", nil},
		{"hop-by-hop and forwarding headers", "GET", "/svc/hop", "", hop},
		{"no User-Agent", "GET", "/svc/x", "", http.Header{"User-Agent": {""}}},
		{"POST body", "POST", "/svc/x", "payload", http.Header{"Content-Type": {"text/plain"}}},
		{"HEAD", "HEAD", "/svc/x", "", nil},
		{"declared trailer", "GET", "/svc/trailer", "", http.Header{"Te": {"trailers"}}},
		{"undeclared trailer", "GET", "/svc/undeclared-trailer", "", nil},
		{"event stream", "GET", "/svc/sse", "", nil},
		{"early hints", "GET", "/svc/early", "", nil},
		{"no content", "DELETE", "/svc/empty", "", nil},
		{"unknown service", "GET", "/nosuch/x", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := do(t, lean, tc.method, tc.target, tc.body, tc.header)
			want := do(t, reference, tc.method, tc.target, tc.body, tc.header)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("forward:\n%+v\nReverseProxy:\n%+v", got, want)
			}
		})
	}
}

func TestCanForward(t *testing.T) {
	for q, want := range map[string]bool{
		"":          true,
		"a=1&b=%41": true,
		"a=1;b=2":   false,
		"a=%4":      false,
		"a=%zz":     false,
	} {
		if got := cleanQuery(q); got != want {
			t.Errorf("cleanQuery(%q) = %v; want %v", q, got, want)
		}
	}
	up := httptest.NewRequest("GET", "/svc/ws", nil)
	up.Header.Set("Connection", "Upgrade")
	up.Header.Set("Upgrade", "websocket")
	if canForward(up) {
		t.Error("canForward(upgrade) = true; ReverseProxy tunnels upgrades")
	}
	for ct, want := range map[string]bool{
		"text/event-stream":                true,
		"Text/Event-Stream; charset=utf-8": true,
		"text/event-stream ;a=b":           true,
		"text/event-streamx":               false,
		"text/plain":                       false,
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v; want %v", ct, got, want)
		}
	}
}
