package gateway

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// clientWait bounds a test client's wait for the gateway to answer or
// close: far longer than the timeouts under test, so that reaching it
// means the gateway did not act.
const clientWait = 10 * time.Second

// metric returns the value of one series of the gateway's /metrics, 0 when
// absent, NaN when /metrics cannot be read.
func metric(g *Gateway, series string) float64 {
	return testutil.Metric(nil, "http://"+g.AdminAddr()+"/metrics", series)
}

// dial opens a raw connection to the proxy, bounded by clientWait.
func dial(t *testing.T, g *Gateway) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", g.ProxyAddr(), clientWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(clientWait))
	return c
}

// waitClosed reads c until the gateway closes it, and fails the test if
// the client's own deadline ends the wait instead.
func waitClosed(t *testing.T, r io.Reader, what string) {
	t.Helper()
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open after %v", what, clientWait)
	}
}

// startSlowBody sends a request that announces 100 bytes of body and
// sends 10.
func startSlowBody(t *testing.T, g *Gateway, path string) net.Conn {
	t.Helper()
	c := dial(t, g)
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n0123456789", path)
	return c
}

// bodyReader is a backend that reads the whole request body before it
// answers with its length.
func bodyReader(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		fmt.Fprintf(w, "%d bytes", len(b))
	}))
	t.Cleanup(s.Close)
	return s
}

// A client that sends its body slowly is cut off once the read timeout
// has passed since its request began; before the fix it held the
// connection (and a goroutine upstream) for as long as it liked.
func TestProxyCutsASlowBody(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTP.ReadTimeout = 300 * time.Millisecond
	g := startGateway(t, cfg)
	announce(t, g, "up", "", bodyReader(t))
	testutil.Eventually(t, "the backend", func() bool { code, _ := testutil.Get(t, "http://"+g.ProxyAddr()+"/up/"); return code == 200 })

	began := time.Now()
	c := startSlowBody(t, g, "/up/x")
	waitClosed(t, c, "a connection whose body stalled")
	if d := time.Since(began); d < cfg.HTTP.ReadTimeout {
		t.Errorf("cut after %v, before the read timeout %v", d, cfg.HTTP.ReadTimeout)
	}
}

// A keep-alive connection with no request is closed after the idle
// timeout.
func TestProxyClosesIdleConnections(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTP.IdleTimeout = 300 * time.Millisecond
	g := startGateway(t, cfg)
	announce(t, g, "up", "", testpub.Backend(t, "a"))
	testutil.Eventually(t, "the backend", func() bool { code, _ := testutil.Get(t, "http://"+g.ProxyAddr()+"/up/"); return code == 200 })

	c := dial(t, g)
	br := bufio.NewReader(c)
	// The server's idle time starts after its response, so after this
	// moment: the lower bound below holds however the two clocks' readings
	// fall.
	idleFrom := time.Now()
	fmt.Fprint(c, "GET /up/x HTTP/1.1\r\nHost: gw\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("first request: %d %q, close %v", resp.StatusCode, body, resp.Close)
	}
	waitClosed(t, br, "an idle keep-alive connection")
	if d := time.Since(idleFrom); d < cfg.HTTP.IdleTimeout {
		t.Errorf("closed after %v idle, before the idle timeout %v", d, cfg.HTTP.IdleTimeout)
	}
	testutil.Eventually(t, "no open connection", func() bool { return metric(g, "pushlb_http_connections") == 0 })
}

// The read timeout bounds the request, not the response: a stream goes on
// after it. A slow-body connection opened after the stream began and cut
// by the read timeout proves that the timeout has passed for the stream
// too.
func TestProxyStreamOutlivesTheReadTimeout(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTP.ReadTimeout = 300 * time.Millisecond
	g := startGateway(t, cfg)
	next := make(chan struct{})
	stream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/feed" {
			io.ReadAll(r.Body)
			return
		}
		rc := http.NewResponseController(w)
		for i := range 2 {
			fmt.Fprintf(w, "event %d\n", i)
			if rc.Flush() != nil {
				return
			}
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(stream.Close)
	announce(t, g, "events", "", stream)
	testutil.Eventually(t, "the backend", func() bool { code, _ := testutil.Get(t, "http://"+g.ProxyAddr()+"/events/"); return code == 200 })

	resp, err := http.Get("http://" + g.ProxyAddr() + "/events/feed")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "event 0\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	slow := startSlowBody(t, g, "/events/upload")
	waitClosed(t, slow, "a slow-body connection")
	next <- struct{}{}
	if line, err := br.ReadString('\n'); line != "event 1\n" {
		t.Fatalf("the stream was cut by the read timeout: %q, %v", line, err)
	}
	next <- struct{}{}
}

// With maxConns 2, a third connection is not served while two are open:
// the backend never has three requests at once, the listener counts the
// wait, and the third is served once one of the two closes.
func TestProxyConnectionLimit(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTP.MaxConns = 2
	// The backend holds requests as long as the test needs, not within the
	// balancer's default 1 s read timeout.
	cfg.Balancer.ClientsConfig = balancer.DefaultClientsConfig()
	cfg.Balancer.Defaults.ReadTimeout = time.Minute
	g := startGateway(t, cfg)
	var inFlight, most atomic.Int64
	arrived := make(chan struct{}, 3)
	release := make(chan struct{})
	held := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/hold" {
			return
		}
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(held.Close)
	releaseAll := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseAll) // runs before held.Close
	announce(t, g, "held", "", held)
	testutil.Eventually(t, "the backend", func() bool {
		code, _, err := testutil.Fetch(nil, "http://"+g.ProxyAddr()+"/held/")
		return err == nil && code == 200
	})
	http.DefaultClient.CloseIdleConnections() // frees the slot of the probe's connection
	testutil.Eventually(t, "the probe's connection closed", func() bool { return metric(g, "pushlb_http_connections") == 0 })
	waits := metric(g, "pushlb_http_connection_waits_total")

	send := func() (net.Conn, *bufio.Reader) {
		c := dial(t, g)
		fmt.Fprint(c, "GET /held/hold HTTP/1.1\r\nHost: gw\r\n\r\n")
		return c, bufio.NewReader(c)
	}
	c1, r1 := send()
	send()
	testutil.Receive(t, arrived, clientWait, "the first request")
	testutil.Receive(t, arrived, clientWait, "the second request")
	send()
	testutil.Eventually(t, "the third connection to wait", func() bool {
		return metric(g, "pushlb_http_connection_waits_total") == waits+1
	})
	// The listener holds the third connection unread: its request cannot
	// have reached the backend.
	select {
	case <-arrived:
		t.Fatal("a third request was served while two connections were open")
	default:
	}
	// Both held requests answer; the second connection stays open
	// (keep-alive), so only closing the first frees a slot.
	releaseAll()
	resp, err := http.ReadResponse(r1, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first response: %v %v", resp, err)
	}
	resp.Body.Close()
	c1.Close()
	testutil.Receive(t, arrived, clientWait, "the third request, once the first connection closed")
	if m := most.Load(); m != 2 {
		t.Errorf("the backend had %d requests at once, want 2", m)
	}
}

// /healthz is liveness and /readyz readiness: while NATS is down the
// gateway stays ready, says so in /readyz and the metrics, and goes on
// routing to the instances it knew; it reports the reconnection.
func TestReadyDuringNATSOutage(t *testing.T) {
	ns := natstest.Start(t)
	cfg := testConfig(t)
	cfg.NATS.URL = ns.URL()
	g := startGateway(t, cfg)
	testpub.Announce(t, ns.Connect(t), "orders", "", testpub.Backend(t, "a"))
	proxy, admin := "http://"+g.ProxyAddr(), "http://"+g.AdminAddr()
	testutil.Eventually(t, "the backend", func() bool { code, _ := testutil.Get(t, proxy+"/orders/x"); return code == 200 })

	ready := func() (int, Readiness) {
		t.Helper()
		code, body := testutil.Get(t, admin+"/readyz")
		var r Readiness
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("/readyz %d: %q: %v", code, body, err)
		}
		return code, r
	}
	if code, r := ready(); code != 200 || !r.Ready || r.NATS != "connected" || r.Since != nil || r.Services != 1 || r.Instances != 1 {
		t.Fatalf("/readyz before the outage: %d %+v", code, r)
	}
	if m := metric(g, "pushlb_nats_connected"); m != 1 {
		t.Fatalf("pushlb_nats_connected = %v before the outage", m)
	}

	ns.Shutdown()
	testutil.Eventually(t, "/readyz to show the outage", func() bool { _, r := ready(); return r.NATS == "disconnected" })
	code, r := ready()
	if code != 200 || !r.Ready || r.Since == nil || r.Instances != 1 {
		t.Fatalf("/readyz during the outage: %d %+v", code, r)
	}
	if code, _ := testutil.Get(t, admin+"/healthz"); code != 200 {
		t.Fatalf("/healthz during the outage: %d", code)
	}
	if m := metric(g, "pushlb_nats_connected"); m != 0 {
		t.Errorf("pushlb_nats_connected = %v during the outage", m)
	}
	if m := metric(g, "pushlb_nats_disconnected_seconds"); !(m > 0) {
		t.Errorf("pushlb_nats_disconnected_seconds = %v during the outage", m)
	}
	for range 20 {
		if code, body := testutil.Get(t, proxy+"/orders/x"); code != 200 || body != "a /x" {
			t.Fatalf("routing during the outage: %d %q", code, body)
		}
	}

	ns.Restart(t)
	testutil.Eventually(t, "/readyz to show the reconnection", func() bool { _, r := ready(); return r.NATS == "connected" })
	if m := metric(g, "pushlb_nats_disconnects_total"); m != 1 {
		t.Errorf("pushlb_nats_disconnects_total = %v, want 1", m)
	}
}

// The http section: YAML keys, flags over them, negative values refused.
func TestHTTPSettings(t *testing.T) {
	if d := DefaultConfig().HTTP; d.ReadTimeout == 0 || d.IdleTimeout == 0 || d.ReadHeaderTimeout == 0 || d.MaxConns == 0 || d.MaxHeaderBytes == 0 || d.WriteTimeout != 0 {
		t.Fatalf("defaults %+v", d)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "gw.yaml")
	os.WriteFile(path, []byte("http: {readHeaderTimeout: 2s, readTimeout: 30s, writeTimeout: 1m, idleTimeout: 20s, maxHeaderBytes: 8192, maxConns: 500}\n"), 0o600)
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := HTTPConfig{ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute, IdleTimeout: 20 * time.Second, MaxHeaderBytes: 8192, MaxConns: 500}
	if cfg.HTTP != want {
		t.Fatalf("loaded %+v, want %+v", cfg.HTTP, want)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"-http-read-timeout", "5s", "-http-write-timeout", "0", "-http-idle-timeout", "1s", "-http-max-conns", "0"}); err != nil {
		t.Fatal(err)
	}
	want.ReadTimeout, want.WriteTimeout, want.IdleTimeout, want.MaxConns = 5*time.Second, 0, time.Second, 0
	if cfg.HTTP != want {
		t.Fatalf("after the flags %+v, want %+v", cfg.HTTP, want)
	}
	for _, body := range []string{"http: {readTimeout: -1s}\n", "http: {maxConns: -1}\n", "http: {maxHeaderBytes: -1}\n", "http: {idleTimout: 1s}\n"} {
		os.WriteFile(path, []byte(body), 0o600)
		if _, err := LoadFile(path); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "http.") {
			t.Errorf("%q: %v, want ErrConfig naming the key", body, err)
		}
	}
}
