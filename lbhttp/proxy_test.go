package lbhttp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// newFront serves proxy on 127.0.0.1; the returned client's idle
// connections are closed with the server.
func newFront(t testing.TB, tr http.RoundTripper, opts ...ProxyOption) (*httptest.Server, *http.Client) {
	t.Helper()
	p, err := NewProxy(tr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	return front, front.Client()
}

func TestProxyDefaultRouteStripsServicePrefix(t *testing.T) {
	orders := newBackend(t, "orders-1", nil)
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{orders.server("")})})
	front, client := newFront(t, tr)

	tests := []struct {
		path, wantPath, wantRawPath, wantQuery string
	}{
		{"/orders/api/x?q=1", "/api/x", "", "q=1"},
		{"/orders", "/", "", ""},
		{"/orders/", "/", "", ""},
		{"/orders/a%2Fb/c?x=%20", "/a/b/c", "/a%2Fb/c", "x=%20"},
	}
	for _, tc := range tests {
		req := newRequest(t, "GET", front.URL+tc.path, nil)
		req.Header.Set("X-Forwarded-For", "6.6.6.6") // a client's claim: dropped
		status, body, err := testutil.Do(client, req)
		if err != nil || status != 200 || body != "orders-1" {
			t.Fatalf("GET %s = %d %q, %v", tc.path, status, body, err)
		}
		s := orders.last.Load()
		if s.Path != tc.wantPath || s.RawPath != tc.wantRawPath || s.Query != tc.wantQuery {
			t.Errorf("GET %s reached the backend as path %q raw %q query %q; want %q %q %q",
				tc.path, s.Path, s.RawPath, s.Query, tc.wantPath, tc.wantRawPath, tc.wantQuery)
		}
		frontHost := strings.TrimPrefix(front.URL, "http://")
		for h, want := range map[string]string{
			"X-Forwarded-For":    "127.0.0.1",
			"X-Forwarded-Host":   frontHost,
			"X-Forwarded-Proto":  "http",
			"X-Forwarded-Prefix": "/orders",
		} {
			if got := s.Header.Get(h); got != want {
				t.Errorf("GET %s: %s = %q, want %q", tc.path, h, got, want)
			}
		}
		if want := orders.Listener.Addr().String(); s.Host != want {
			t.Errorf("Host = %q, want the server address %q", s.Host, want)
		}
	}
}

func TestProxyRoutes(t *testing.T) {
	orders := newBackend(t, "orders-1", nil)
	catalog := newBackend(t, "catalog-1", nil)
	bs := BalancerMap{
		"orders":  newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{orders.server("")}),
		"catalog": newBalancer(t, "catalog", balancer.DefaultConfig(), []balancer.Server{catalog.server("")}),
	}
	tr := newTestTransport(t, bs)
	routes := WithRoutes(
		Route{Prefix: "/api", Service: "catalog"},
		Route{Prefix: "/api/orders/", Service: "orders", StripPrefix: true},
	)

	tests := []struct {
		name       string
		opts       []ProxyOption
		path       string
		wantStatus int
		wantBody   string
		backend    *backend
		wantPath   string
	}{
		{name: "longest prefix wins", opts: []ProxyOption{routes}, path: "/api/orders/list?x=1", wantStatus: 200, wantBody: "orders-1", backend: orders, wantPath: "/list"},
		{name: "prefix alone", opts: []ProxyOption{routes}, path: "/api/orders", wantStatus: 200, wantBody: "orders-1", backend: orders, wantPath: "/"},
		{name: "shorter prefix, not stripped", opts: []ProxyOption{routes}, path: "/api/ordersx/1", wantStatus: 200, wantBody: "catalog-1", backend: catalog, wantPath: "/api/ordersx/1"},
		{name: "default rule still on", opts: []ProxyOption{routes}, path: "/orders/z", wantStatus: 200, wantBody: "orders-1", backend: orders, wantPath: "/z"},
		{name: "default rule off", opts: []ProxyOption{routes, WithoutDefaultRoute()}, path: "/orders/z", wantStatus: 404, wantBody: "no route\n"},
		{name: "unknown service", path: "/billing/z", wantStatus: 404, wantBody: "unknown service\n"},
		{name: "not a service name", path: "/a%20b/z", wantStatus: 404, wantBody: "no route\n"},
		{name: "climbs above the root", path: "/%2e%2e/z", wantStatus: 400, wantBody: "bad path\n"},
		{name: "root", path: "/", wantStatus: 404, wantBody: "no route\n"},
		{name: "filtered service", opts: []ProxyOption{WithServices(func(s string) bool { return s == "catalog" })}, path: "/orders/z", wantStatus: 404, wantBody: "no route\n"},
		{name: "allowed service", opts: []ProxyOption{WithServices(func(s string) bool { return s == "catalog" })}, path: "/catalog/z", wantStatus: 200, wantBody: "catalog-1", backend: catalog, wantPath: "/z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			front, client := newFront(t, tr, tc.opts...)
			status, body, err := testutil.Do(client, newRequest(t, "GET", front.URL+tc.path, nil))
			if err != nil || status != tc.wantStatus || body != tc.wantBody {
				t.Fatalf("GET %s = %d %q, %v; want %d %q", tc.path, status, body, err, tc.wantStatus, tc.wantBody)
			}
			if tc.backend != nil {
				if got := tc.backend.last.Load().Path; got != tc.wantPath {
					t.Errorf("backend saw path %q, want %q", got, tc.wantPath)
				}
			}
		})
	}
}

func TestProxyPreserveHost(t *testing.T) {
	orders := newBackend(t, "orders-1", nil)
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{orders.server("")})})
	front, client := newFront(t, tr, WithPreserveHost())
	req := newRequest(t, "GET", front.URL+"/orders/x", nil)
	req.Host = "shop.example"
	if _, _, err := testutil.Do(client, req); err != nil {
		t.Fatal(err)
	}
	if got := orders.last.Load().Host; got != "shop.example" {
		t.Errorf("Host = %q, want the client's", got)
	}
}

func TestProxyErrorAnswers(t *testing.T) {
	release := make(chan struct{})
	slow := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	slowCfg := balancer.DefaultConfig()
	slowCfg.ReadTimeout = 50 * time.Millisecond
	bs := BalancerMap{
		"empty": newBalancer(t, "empty", balancer.DefaultConfig(), nil),
		"dead":  newBalancer(t, "dead", balancer.DefaultConfig(), []balancer.Server{refusing(t, "d1"), refusing(t, "d2")}),
		"slow":  newBalancer(t, "slow", slowCfg, []balancer.Server{slow.server("")}),
	}
	var logs lockedBuffer
	tr := newTestTransport(t, bs)
	front, client := newFront(t, tr, WithProxyLogger(zerolog.New(&logs)))
	for _, tc := range []struct {
		path, body string
		status     int
	}{
		{"/empty/x", "no instances of empty available\n", 503},
		{"/dead/x", "dead unavailable\n", 502},
		{"/slow/x", "slow timed out\n", 504},
		{"/nope/x", "unknown service\n", 404},
	} {
		req := newRequest(t, "GET", front.URL+tc.path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || string(body) != tc.body {
			t.Errorf("GET %s = %d %q; want %d %q", tc.path, resp.StatusCode, body, tc.status, tc.body)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("GET %s: Content-Type %q", tc.path, ct)
		}
	}
	// The details go to the log, not to the client.
	out := logs.String()
	for _, want := range []string{`"level":"warn"`, `"service":"dead"`, "connection refused", `"status":504`, `"attempts":2`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
}

// TestProxyErrorLogIsLimited: a dead instance under load costs one warning
// per upstream and interval, the next one counting the failures folded
// since; another upstream's first failure is logged at once.
func TestProxyErrorLogIsLimited(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Breaker.Threshold = 1000 // every request tries the dead server
	bs := BalancerMap{
		"dead":  newBalancer(t, "dead", cfg, []balancer.Server{refusing(t, "d1")}),
		"other": newBalancer(t, "other", cfg, []balancer.Server{refusing(t, "o1")}),
	}
	var logs lockedBuffer
	p, err := NewProxy(newTestTransport(t, bs), WithProxyLogger(zerolog.New(&logs)))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	p.errLog.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	get := func(path string, n int) {
		for range n {
			if status, _, err := testutil.Do(front.Client(), newRequest(t, "GET", front.URL+path, nil)); err != nil || status != 502 {
				t.Fatalf("GET %s = %d, %v; want 502", path, status, err)
			}
		}
	}
	lines := func() []string { return strings.Split(strings.TrimSpace(logs.String()), "\n") }

	get("/dead/x", 50)
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], `"service":"dead"`) || strings.Contains(l[0], "folded") {
		t.Fatalf("50 failures of one upstream logged %d lines, want 1 without a count:\n%s", len(l), logs.String())
	}
	get("/other/x", 1)
	if l := lines(); len(l) != 2 || !strings.Contains(l[1], `"service":"other"`) {
		t.Fatalf("another upstream's first failure not logged at once:\n%s", logs.String())
	}
	mu.Lock()
	now = now.Add(errorLogInterval)
	mu.Unlock()
	get("/dead/x", 1)
	if l := lines(); len(l) != 3 || !strings.Contains(l[2], `"service":"dead"`) || !strings.Contains(l[2], `"folded":49`) {
		t.Fatalf("after the interval, want a line counting 49 folded failures:\n%s", logs.String())
	}
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestProxyRetriesPOSTBodyAfterRefusedConnection(t *testing.T) {
	good := newBackend(t, "good", nil)
	lb := newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{refusing(t, "dead"), good.server("")},
		balancer.WithRule(script("dead", "good")))
	var logs lockedBuffer
	tr := newTestTransport(t, BalancerMap{"orders": lb}, WithLogger(zerolog.New(&logs).Level(zerolog.DebugLevel)))
	front, client := newFront(t, tr)
	payload := strings.Repeat("p", 100<<10)
	status, body, err := testutil.Do(client, newRequest(t, "POST", front.URL+"/orders/new", strings.NewReader(payload)))
	if err != nil || status != 200 || body != "good" {
		t.Fatalf("POST = %d %q, %v", status, body, err)
	}
	if got := good.last.Load().Body; got != payload {
		t.Errorf("good received %d bytes, want %d", len(got), len(payload))
	}
	if out := logs.String(); !strings.Contains(out, `"next":"good@`) || !strings.Contains(out, "lbhttp: retrying") {
		t.Errorf("retry not logged:\n%s", out)
	}
}

func TestProxyStreamsResponses(t *testing.T) {
	next := make(chan struct{})
	stream := newBackend(t, "stream", func(w http.ResponseWriter, r *http.Request) {
		// A known length and a plain type: ReverseProxy flushes these only
		// because the Proxy's flushWriter does (it always flushes event
		// streams and bodies of unknown length).
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "27")
		rc := http.NewResponseController(w)
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			if err := rc.Flush(); err != nil {
				return
			}
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	})
	tr := newTestTransport(t, BalancerMap{"events": newBalancer(t, "events", balancer.DefaultConfig(), []balancer.Server{stream.server("")})})
	front, client := newFront(t, tr)
	resp, err := client.Do(newRequest(t, "GET", front.URL+"/events/feed", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		// Each event must arrive before the backend is told to send the
		// next one: the proxy does not buffer.
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q, %v", i, line, err)
		}
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		next <- struct{}{}
	}
}

func TestProxyTunnelsUpgrade(t *testing.T) {
	// A backend that switches to an echo protocol by hand, as a WebSocket
	// server does after its handshake.
	echo := newBackend(t, "echo", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "upgrade required", http.StatusUpgradeRequired)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw)
	})
	wsb := newBalancer(t, "ws", balancer.DefaultConfig(), []balancer.Server{echo.server("")})
	tr := newTestTransport(t, BalancerMap{"ws": wsb})
	front, _ := newFront(t, tr)

	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(front.URL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /ws/socket HTTP/1.1\r\nHost: gateway\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "echo" {
		t.Fatalf("handshake: %s, Upgrade %q", resp.Status, resp.Header.Get("Upgrade"))
	}
	for _, msg := range []string{"hello", "over the tunnel"} {
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(br, buf); err != nil || string(buf) != msg {
			t.Fatalf("echo = %q, %v; want %q", buf, err, msg)
		}
	}
	if got := echo.last.Load().Path; got != "/socket" {
		t.Errorf("backend saw path %q", got)
	}
	// A switched protocol is a connection, not a request in flight.
	if n := wsb.ServerStats("echo").ActiveRequests(); n != 0 {
		t.Errorf("an open tunnel counts as %d active requests, want 0", n)
	}
}

func TestNewProxyOptions(t *testing.T) {
	tr := newTestTransport(t, BalancerMap{})
	for name, opts := range map[string][]ProxyOption{
		"nil option":       {nil},
		"relative prefix":  {WithRoutes(Route{Prefix: "api", Service: "a"})},
		"no service":       {WithRoutes(Route{Prefix: "/api"})},
		"bad service name": {WithRoutes(Route{Prefix: "/api", Service: "a/b"})},
		"duplicate prefix": {WithRoutes(Route{Prefix: "/api", Service: "a"}, Route{Prefix: "/api/", Service: "b"})},
		"nil filter":       {WithServices(nil)},
		"unclean prefix":   {WithRoutes(Route{Prefix: "/api/../x", Service: "a"})},
		"empty segment":    {WithRoutes(Route{Prefix: "/api//x", Service: "a"})},
	} {
		if _, err := NewProxy(tr, opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", name, err)
		}
	}
	if _, err := NewProxy(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil transport: %v", err)
	}
}

// rawGet sends "GET target" on a new connection, as written (a client
// library might clean the path first), and returns the status.
func rawGet(t *testing.T, front *httptest.Server, target string, header ...string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", front.Listener.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n", target)
	for _, h := range header {
		fmt.Fprintf(conn, "%s\r\n", h)
	}
	io.WriteString(conn, "\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// hasDotSegment reports whether a path, split on '/', '\' and ';', has a
// "." or ".." segment.
func hasDotSegment(path string) bool {
	for _, seg := range strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg, _, _ = strings.Cut(seg, ";"); seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// Dot-segments are removed before routing; a ".." that would leave its
// route's prefix (or hides behind an escape) is refused, so no path reaches
// another service than the one it names, and no service sees a
// dot-segment, decoded or not.
func TestProxyCleansDotSegments(t *testing.T) {
	echo := newBackend(t, "echo", nil)
	secret := newBackend(t, "secret", nil)
	bs := BalancerMap{
		"echo":   newBalancer(t, "echo", balancer.DefaultConfig(), []balancer.Server{echo.server("")}),
		"secret": newBalancer(t, "secret", balancer.DefaultConfig(), []balancer.Server{secret.server("")}),
	}
	tr := newTestTransport(t, bs)
	front, _ := newFront(t, tr, WithRoutes(Route{Prefix: "/api/echo", Service: "echo", StripPrefix: true}))

	for _, tc := range []struct {
		target   string
		status   int
		wantPath string // the escaped path echo sees, when 200
	}{
		{"/echo/./x", 200, "/x"},
		{"/echo/%2e/x", 200, "/x"},
		{"//echo//x", 200, "/x"},
		{"/echo/a/../x", 200, "/x"},
		{"/echo/a/%2E%2e/x/", 200, "/x/"},
		{"/echo/a/b/../..", 200, "/"},
		{"/echo/a%2Fb/../x", 200, "/x"},
		{"/echo/a%2Fb", 200, "/a%2Fb"},
		{"/echo/...", 200, "/..."},
		{"/echo/.well-known/x", 200, "/.well-known/x"},
		{"/api/echo/a/../x", 200, "/x"},
		{"/api/./echo/x", 200, "/x"},
		{"/echo/../secret/x", 400, ""},
		{"/echo/%2e%2e/secret/x", 400, ""},
		{"/echo/.%2E/secret/x", 400, ""},
		{"/echo/a/../../secret/x", 400, ""},
		{"/echo/../echo/x", 400, ""},
		{"/echo/..", 400, ""},
		{"/api/echo/../../secret/x", 400, ""},
		{"/api/echo/../x", 400, ""},
		{"/..", 400, ""},
		{"/%2e%2e/secret/x", 400, ""},
		{"/echo/..%2Fsecret", 400, ""},
		{"/echo/%2e%2e%2fsecret", 400, ""},
		{"/echo/a%5C..%5Cx", 400, ""},
		{`/echo/..\x`, 400, ""},
		{"/echo/..;/secret", 400, ""},
		{"/echo/.;x/y", 400, ""},
	} {
		before := echo.hits.Load()
		if got := rawGet(t, front, tc.target); got != tc.status {
			t.Errorf("GET %s = %d, want %d", tc.target, got, tc.status)
			continue
		}
		if tc.status != 200 {
			if echo.hits.Load() != before {
				t.Errorf("GET %s reached echo", tc.target)
			}
			continue
		}
		s := echo.last.Load()
		escaped := s.RawPath
		if escaped == "" {
			escaped = s.Path
		}
		if escaped != tc.wantPath {
			t.Errorf("GET %s reached echo as %q, want %q", tc.target, escaped, tc.wantPath)
		}
		if hasDotSegment(s.Path) && tc.wantPath != "/a%2Fb" {
			t.Errorf("GET %s: echo saw the dot-segment in %q", tc.target, s.Path)
		}
	}
	if n := secret.hits.Load(); n != 0 {
		t.Errorf("secret was reached %d times", n)
	}
}

func TestRemoveDotSegmentsIsIdempotent(t *testing.T) {
	for _, path := range []string{"/a/./b/../c/", "//a//b", "/a/%2e%2E/b", "/a/b/..", "/a/.", "/", "/a%2Fb/c"} {
		clean, _, lowest, ok := removeDotSegments(path)
		if !ok {
			t.Fatalf("%s: refused", path)
		}
		again, _, lowest2, ok := removeDotSegments(clean)
		if !ok || again != clean || lowest2 != -1 {
			t.Errorf("%s -> %s (lowest %d) -> %s (lowest %d, %v)", path, clean, lowest, again, lowest2, ok)
		}
	}
}

// FuzzProxyPath: a path the proxy forwards has no dot-segment left, even
// with its escaped dots, slashes and backslashes decoded, and no empty
// segment.
func FuzzProxyPath(f *testing.F) {
	for _, s := range []string{"/echo/../x", "/echo/%2e%2e/x", "//echo//x", "/echo/a/./b/../c", "/echo/..%2f..", "/echo/..;/x", "/a%5C..", "/"} {
		f.Add(s)
	}
	p, err := NewProxy(http.DefaultTransport, WithRoutes(Route{Prefix: "/api/echo", Service: "echo", StripPrefix: true}))
	if err != nil {
		f.Fatal(err)
	}
	decode := strings.NewReplacer("%2e", ".", "%2E", ".", "%2f", "/", "%2F", "/", "%5c", `\`, "%5C", `\`)
	f.Fuzz(func(t *testing.T, path string) {
		if !needsCleaning(path) {
			return
		}
		clean, ok := p.cleanPath(path)
		if !ok {
			return
		}
		if hasDotSegment(decode.Replace(clean)) || strings.Contains(clean, "//") {
			t.Fatalf("%q cleaned to %q", path, clean)
		}
	})
}

// The backend learns the client's address from the connection, never from
// what the client claims: X-Real-IP and X-Forwarded-For are replaced,
// Forwarded is dropped.
func TestProxySetsXRealIPFromTheConnection(t *testing.T) {
	echo := newBackend(t, "echo", nil)
	tr := newTestTransport(t, BalancerMap{"echo": newBalancer(t, "echo", balancer.DefaultConfig(), []balancer.Server{echo.server("")})})
	front, _ := newFront(t, tr)
	if got := rawGet(t, front, "/echo/x", "X-Real-IP: 6.6.6.6", "X-Forwarded-For: 6.6.6.6, 7.7.7.7", "Forwarded: for=6.6.6.6"); got != 200 {
		t.Fatalf("status %d", got)
	}
	h := echo.last.Load().Header
	if got := h.Values("X-Real-Ip"); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("X-Real-IP = %q, want [127.0.0.1]", got)
	}
	if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want [127.0.0.1]", got)
	}
	if got := h.Get("Forwarded"); got != "" {
		t.Errorf("Forwarded = %q, want none", got)
	}
}

// A stray '%' (not followed by two hex digits) is refused, so that it can
// never make the cleaner read what follows as an escape: "%\%2E" would
// otherwise hide a "." behind a backslash (found by FuzzProxyPath).
func TestRemoveDotSegmentsRefusesInvalidEscapes(t *testing.T) {
	for _, path := range []string{`/%\%2E`, "/a/%zz", "/a/%2", "/a/b%"} {
		if clean, _, _, ok := removeDotSegments(path); ok {
			t.Errorf("%q accepted as %q", path, clean)
		}
	}
	for _, path := range []string{"/a/%2E%2e/b", "/a/%41%7e"} {
		if _, _, _, ok := removeDotSegments(path); !ok {
			t.Errorf("%q refused", path)
		}
	}
}
