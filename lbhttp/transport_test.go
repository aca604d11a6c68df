package lbhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func TestTransportBalancesAndRewritesURL(t *testing.T) {
	backends := []*backend{newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)}
	var servers []balancer.Server
	for _, b := range backends {
		servers = append(servers, b.server(""))
	}
	lb := newBalancer(t, "orders", balancer.DefaultConfig(), servers)
	tr := newTestTransport(t, BalancerMap{"orders": lb})
	client := &http.Client{Transport: tr}

	const perBackend = 10
	for range perBackend * len(backends) {
		status, _, err := testutil.Do(client, newRequest(t, "GET", "http://orders/api/x?q=1&r=a%20b", nil))
		if err != nil || status != 200 {
			t.Fatalf("GET = %d, %v", status, err)
		}
	}
	for _, b := range backends {
		if got := b.hits.Load(); got != perBackend {
			t.Errorf("backend %s got %d requests, want %d (round robin)", b.id, got, perBackend)
		}
		s := b.last.Load()
		if s.Path != "/api/x" || s.Query != "q=1&r=a%20b" {
			t.Errorf("backend %s saw path %q query %q", b.id, s.Path, s.Query)
		}
		if want := b.Listener.Addr().String(); s.Host != want {
			t.Errorf("backend %s saw Host %q, want the server address %q", b.id, s.Host, want)
		}
		st := lb.ServerStats(b.id)
		if st.Requests() != perBackend || st.ActiveRequests() != 0 {
			t.Errorf("backend %s stats: %d requests, %d active; want %d, 0", b.id, st.Requests(), st.ActiveRequests(), perBackend)
		}
		if rt, ok := st.ResponseTime(); !ok || rt <= 0 {
			t.Errorf("backend %s response time = %v, %v; want a positive average", b.id, rt, ok)
		}
	}

	// An explicit Host header is kept.
	req := newRequest(t, "GET", "http://orders/h", nil)
	req.Host = "shop.example"
	if _, _, err := testutil.Do(client, req); err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, b := range backends {
		if s := b.last.Load(); s.Path == "/h" {
			hosts = append(hosts, s.Host)
		}
	}
	if len(hosts) != 1 || hosts[0] != "shop.example" {
		t.Errorf("explicit Host reached backends as %q, want [shop.example]", hosts)
	}
}

func TestTransportResponseRequestIsTheCallers(t *testing.T) {
	b := newBackend(t, "a", nil)
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{b.server("")})})
	req := newRequest(t, "GET", "http://orders/x", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request != req {
		t.Errorf("resp.Request = %v, want the caller's request (for redirects)", resp.Request.URL)
	}
}

func TestTransportSkipsRefusingServerAndTripsItsBreaker(t *testing.T) {
	good := newBackend(t, "good", nil)
	dead := refusing(t, "dead")
	// The default rule (ZoneAvoidance) skips servers whose breaker is open.
	lb := newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{dead, good.server("")})
	var c counts
	tr := newTestTransport(t, BalancerMap{"orders": lb}, WithObserver(c.observer()))
	client := &http.Client{Transport: tr}

	for i := range 10 {
		status, body, err := testutil.Do(client, newRequest(t, "GET", "http://orders/", nil))
		if err != nil || status != 200 || body != "good" {
			t.Fatalf("request %d = %d %q, %v; want 200 from good", i, status, body, err)
		}
	}
	st := lb.ServerStats("dead")
	if st.SuccessiveFailures() != 3 || !st.CircuitTripped() {
		t.Errorf("dead: %d successive failures, tripped %v; want 3, true", st.SuccessiveFailures(), st.CircuitTripped())
	}
	if st.Requests() != 3 || st.ActiveRequests() != 0 {
		t.Errorf("dead: %d requests, %d active; want 3 (then skipped), 0", st.Requests(), st.ActiveRequests())
	}
	if c.retries.Load() != 3 || c.connectFailures.Load() != 3 || c.picks.Load() != 13 || c.results.Load() != 13 {
		t.Errorf("observer: picks %d, retries %d, results %d, connect failures %d; want 13, 3, 13, 3",
			c.picks.Load(), c.retries.Load(), c.results.Load(), c.connectFailures.Load())
	}
}

// hijacker reads the request and then drops the connection: the request
// reached the server, but no response came back.
func hijacker(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

// unreplayable is a body without GetBody: http.NewRequest sets GetBody
// only for the readers it knows.
type unreplayable struct{ io.Reader }

func TestTransportRetryPolicy(t *testing.T) {
	tests := []struct {
		name      string
		first     string // "dead" refuses connections, "drop" reads and hangs up
		method    string
		body      io.Reader
		header    string // an Idempotency-Key when set
		retryAll  bool
		wantRetry bool
	}{
		{name: "POST to a refusing server replays the body", first: "dead", method: "POST", body: strings.NewReader("hello"), wantRetry: true},
		{name: "POST without GetBody to a refusing server still retries", first: "dead", method: "POST", body: unreplayable{strings.NewReader("hello")}, wantRetry: true},
		{name: "POST that reached the server is not retried", first: "drop", method: "POST", body: strings.NewReader("hello")},
		{name: "PATCH that reached the server is not retried", first: "drop", method: "PATCH", body: strings.NewReader("hello")},
		{name: "POST is retried with RetryAllOperations", first: "drop", method: "POST", body: strings.NewReader("hello"), retryAll: true, wantRetry: true},
		{name: "POST without GetBody is not retried even with RetryAllOperations", first: "drop", method: "POST", body: unreplayable{strings.NewReader("hello")}, retryAll: true},
		{name: "POST with an Idempotency-Key is retried", first: "drop", method: "POST", body: strings.NewReader("hello"), header: "k1", wantRetry: true},
		{name: "GET is retried", first: "drop", method: "GET", wantRetry: true},
		{name: "PUT is retried", first: "drop", method: "PUT", body: bytes.NewReader([]byte("hello")), wantRetry: true},
		{name: "DELETE is retried", first: "drop", method: "DELETE", wantRetry: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			good := newBackend(t, "good", nil)
			drop := newBackend(t, "drop", hijacker)
			cfg := balancer.DefaultConfig()
			cfg.RetryAllOperations = tc.retryAll
			lb := newBalancer(t, "orders", cfg,
				[]balancer.Server{refusing(t, "dead"), drop.server(""), good.server("")},
				balancer.WithRule(script(tc.first, "good")))
			tr := newTestTransport(t, BalancerMap{"orders": lb})

			req := newRequest(t, tc.method, "http://orders/x", tc.body)
			if tc.header != "" {
				req.Header.Set("Idempotency-Key", tc.header)
			}
			resp, err := tr.RoundTrip(req)
			if !tc.wantRetry {
				var e *Error
				if !errors.As(err, &e) || !errors.Is(err, ErrAllTriesFailed) || e.Attempts != 1 {
					t.Fatalf("RoundTrip = %v; want ErrAllTriesFailed after 1 attempt", err)
				}
				if good.hits.Load() != 0 {
					t.Errorf("good backend got %d requests; want none (no retry)", good.hits.Load())
				}
				if IsConnectFailure(err) {
					t.Errorf("IsConnectFailure(%v) = true for a request that was sent", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 || good.hits.Load() != 1 {
				t.Fatalf("status %d, good backend hits %d; want 200, 1", resp.StatusCode, good.hits.Load())
			}
			if tc.body != nil {
				if got := good.last.Load().Body; got != "hello" {
					t.Errorf("retried body = %q, want hello", got)
				}
			}
			if tc.first == "drop" && lb.ServerStats("drop").SuccessiveFailures() != 0 {
				t.Errorf("a dropped connection after sending counted as a connection failure")
			}
			if tc.first == "dead" && lb.ServerStats("dead").SuccessiveFailures() != 1 {
				t.Errorf("dead: %d successive failures, want 1", lb.ServerStats("dead").SuccessiveFailures())
			}
		})
	}
}

func TestTransportRetryBudget(t *testing.T) {
	tests := []struct {
		name         string
		sameServer   int
		nextServers  int
		order        []string
		servers      []string // "dead" and "good"
		wantOK       bool
		wantAttempts int // of a failed request
		wantDead     int64
		wantGood     int64
	}{
		{name: "default: one next server", nextServers: 1, order: []string{"dead", "good"}, wantOK: true, wantDead: 1, wantGood: 1},
		{name: "MaxAutoRetries=1 retries the same server once", sameServer: 1, nextServers: 1, order: []string{"dead", "good"}, wantOK: true, wantDead: 2, wantGood: 1},
		{name: "MaxAutoRetriesNextServer=0 stops after the same server", sameServer: 0, nextServers: 0, order: []string{"dead", "good"}, wantAttempts: 1, wantDead: 1},
		{name: "MaxAutoRetries=2 without next server", sameServer: 2, nextServers: 0, order: []string{"dead", "good"}, wantAttempts: 3, wantDead: 3},
		{name: "the failed server is not the next one", nextServers: 1, order: []string{"dead", "dead", "dead", "good"}, wantOK: true, wantDead: 1, wantGood: 1},
		{name: "a rule stuck on the failed server fails over at random", nextServers: 1, order: []string{"dead"}, wantOK: true, wantDead: 1, wantGood: 1},
		{name: "only failed servers left: stop", nextServers: 3, order: []string{"dead"}, servers: []string{"dead"}, wantAttempts: 1, wantDead: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			good := newBackend(t, "good", nil)
			all := map[string]balancer.Server{"dead": refusing(t, "dead"), "good": good.server("")}
			names := tc.servers
			if names == nil {
				names = []string{"dead", "good"}
			}
			var servers []balancer.Server
			for _, n := range names {
				servers = append(servers, all[n])
			}
			cfg := balancer.DefaultConfig()
			cfg.MaxAutoRetries, cfg.MaxAutoRetriesNextServer = tc.sameServer, tc.nextServers
			lb := newBalancer(t, "orders", cfg, servers, balancer.WithRule(script(tc.order...)))
			var c counts
			tr := newTestTransport(t, BalancerMap{"orders": lb}, WithObserver(c.observer()))

			resp, err := tr.RoundTrip(newRequest(t, "GET", "http://orders/", nil))
			if tc.wantOK {
				if err != nil {
					t.Fatalf("RoundTrip: %v", err)
				}
				resp.Body.Close()
			} else {
				var e *Error
				if !errors.As(err, &e) || e.Kind != ErrAllTriesFailed || e.Attempts != tc.wantAttempts {
					t.Fatalf("RoundTrip = %v; want ErrAllTriesFailed after %d attempts", err, tc.wantAttempts)
				}
				var op *net.OpError
				if !IsConnectFailure(err) || !errors.As(err, &op) || op.Op != "dial" {
					t.Errorf("error %v: want a connection failure wrapping the dial *net.OpError", err)
				}
			}
			if got := lb.ServerStats("dead").Requests(); got != tc.wantDead {
				t.Errorf("dead got %d attempts, want %d", got, tc.wantDead)
			}
			if st := lb.ServerStats("good"); st != nil && st.Requests() != tc.wantGood {
				t.Errorf("good got %d attempts, want %d", st.Requests(), tc.wantGood)
			}
			if got, want := c.retries.Load(), c.picks.Load()-1; got != want {
				t.Errorf("observer: %d retries for %d picks", got, c.picks.Load())
			}
		})
	}
}

func TestTransportErrors(t *testing.T) {
	empty := newBalancer(t, "empty", balancer.DefaultConfig(), nil)
	dead := newBalancer(t, "dead", balancer.DefaultConfig(), []balancer.Server{refusing(t, "d1"), refusing(t, "d2")})
	tr := newTestTransport(t, BalancerMap{"empty": empty, "dead": dead})

	_, err := tr.RoundTrip(newRequest(t, "GET", "http://empty/x", nil))
	if !errors.Is(err, ErrNoServers) || !errors.Is(err, balancer.ErrNoServers) {
		t.Errorf("no servers: %v; want ErrNoServers", err)
	}
	_, err = tr.RoundTrip(newRequest(t, "GET", "http://nope/x", nil))
	if !errors.Is(err, ErrUnknownService) {
		t.Errorf("unknown service: %v; want ErrUnknownService", err)
	}
	_, err = tr.RoundTrip(newRequest(t, "GET", "http://dead/x", nil))
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrAllTriesFailed) || e.Attempts != 2 || e.Service != "dead" || e.Timeout() {
		t.Errorf("all refused: %v; want ErrAllTriesFailed after 2 attempts, not a timeout", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, `lbhttp: all tries failed for service "dead" after 2 attempts, last on 127.0.0.1:`) ||
		strings.Count(msg, "connection refused") != 1 {
		t.Errorf("message %q", msg)
	}

	// A Factory is a Balancers: every name is a client, so an unknown name
	// is a service without servers.
	f, ferr := balancer.NewFactory(nil)
	if ferr != nil {
		t.Fatal(ferr)
	}
	defer f.Close()
	_, err = newTestTransport(t, f).RoundTrip(newRequest(t, "GET", "http://anything/x", nil))
	if !errors.Is(err, ErrNoServers) {
		t.Errorf("factory, no servers: %v; want ErrNoServers", err)
	}
}

func TestTransportReadTimeout(t *testing.T) {
	release := make(chan struct{})
	slow := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the backend closes
	fast := newBackend(t, "fast", nil)
	cfg := balancer.DefaultConfig()
	cfg.ReadTimeout = 100 * time.Millisecond

	t.Run("one slow server", func(t *testing.T) {
		lb := newBalancer(t, "orders", cfg, []balancer.Server{slow.server("")})
		tr := newTestTransport(t, BalancerMap{"orders": lb})
		req := newRequest(t, "GET", "http://orders/", nil)
		start := time.Now()
		_, err := tr.RoundTrip(req)
		var e *Error
		if !errors.As(err, &e) || !e.Timeout() || e.Attempts != 1 {
			t.Fatalf("RoundTrip = %v; want a timeout after 1 attempt", err)
		}
		// The read timeout ended the wait (net/http's timeout awaiting the
		// response headers), not the request's own 10 s deadline.
		if req.Context().Err() != nil || !strings.Contains(err.Error(), "timeout awaiting response headers") {
			t.Errorf("RoundTrip = %v, request context %v; want the read timeout", err, req.Context().Err())
		}
		t.Logf("timed out after %v (read timeout %v)", time.Since(start), cfg.ReadTimeout)
		if st := lb.ServerStats("slow"); st.SuccessiveFailures() != 0 || st.ActiveRequests() != 0 {
			t.Errorf("a read timeout counted as a connection failure (%d) or left %d active", st.SuccessiveFailures(), st.ActiveRequests())
		}
	})
	t.Run("GET moves on to a fast server", func(t *testing.T) {
		lb := newBalancer(t, "orders", cfg, []balancer.Server{slow.server(""), fast.server("")}, balancer.WithRule(script("slow", "fast")))
		tr := newTestTransport(t, BalancerMap{"orders": lb})
		status, body, err := testutil.Do(&http.Client{Transport: tr}, newRequest(t, "GET", "http://orders/", nil))
		if err != nil || status != 200 || body != "fast" {
			t.Fatalf("GET = %d %q, %v; want 200 from fast", status, body, err)
		}
	})
}

func TestTransportHonoursZoneOnContext(t *testing.T) {
	a, b := newBackend(t, "a1", nil), newBackend(t, "b1", nil)
	lb := newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{a.server("zone-a"), b.server("zone-b")})
	tr := newTestTransport(t, BalancerMap{"orders": lb})
	client := &http.Client{Transport: tr}
	for range 10 {
		req := newRequest(t, "GET", "http://orders/", nil)
		req = req.WithContext(balancer.WithZone(req.Context(), "zone-b"))
		if _, body, err := testutil.Do(client, req); err != nil || body != "b1" {
			t.Fatalf("GET in zone-b = %q, %v", body, err)
		}
	}
	if a.hits.Load() != 0 {
		t.Errorf("zone-a got %d requests", a.hits.Load())
	}
}

func TestTransportForcedZoneFailsOverToOtherZones(t *testing.T) {
	a := newBackend(t, "a1", nil)
	dead := refusing(t, "b1")
	dead.Zone = "zone-b"
	lb := newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{a.server("zone-a"), dead})
	tr := newTestTransport(t, BalancerMap{"orders": lb})
	req := newRequest(t, "GET", "http://orders/", nil)
	req = req.WithContext(balancer.WithZone(req.Context(), "zone-b"))
	if _, body, err := testutil.Do(&http.Client{Transport: tr}, req); err != nil || body != "a1" {
		t.Fatalf("GET = %q, %v; want a1 after zone-b refused", body, err)
	}
}

func TestTransportRetryOnStatus(t *testing.T) {
	busy := newBackend(t, "busy", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	})
	good := newBackend(t, "good", nil)
	servers := []balancer.Server{busy.server(""), good.server("")}

	t.Run("off by default", func(t *testing.T) {
		lb := newBalancer(t, "orders", balancer.DefaultConfig(), servers, balancer.WithRule(script("busy", "good")))
		tr := newTestTransport(t, BalancerMap{"orders": lb})
		status, _, err := testutil.Do(&http.Client{Transport: tr}, newRequest(t, "GET", "http://orders/", nil))
		if err != nil || status != 503 {
			t.Fatalf("GET = %d, %v; want the 503 as is", status, err)
		}
	})
	t.Run("retried when asked", func(t *testing.T) {
		lb := newBalancer(t, "orders", balancer.DefaultConfig(), servers, balancer.WithRule(script("busy", "good")))
		tr := newTestTransport(t, BalancerMap{"orders": lb}, WithRetryOnStatus(503))
		status, body, err := testutil.Do(&http.Client{Transport: tr}, newRequest(t, "GET", "http://orders/", nil))
		if err != nil || status != 200 || body != "good" {
			t.Fatalf("GET = %d %q, %v; want 200 from good", status, body, err)
		}
	})
	t.Run("last answer returned when no retry is left", func(t *testing.T) {
		lb := newBalancer(t, "orders", balancer.DefaultConfig(), servers[:1])
		tr := newTestTransport(t, BalancerMap{"orders": lb}, WithRetryOnStatus(503))
		status, body, err := testutil.Do(&http.Client{Transport: tr}, newRequest(t, "GET", "http://orders/", nil))
		if err != nil || status != 503 || body != "busy\n" {
			t.Fatalf("GET = %d %q, %v; want busy's 503", status, body, err)
		}
	})
	t.Run("POST not retried", func(t *testing.T) {
		lb := newBalancer(t, "orders", balancer.DefaultConfig(), servers, balancer.WithRule(script("busy", "good")))
		tr := newTestTransport(t, BalancerMap{"orders": lb}, WithRetryOnStatus(503))
		status, _, err := testutil.Do(&http.Client{Transport: tr}, newRequest(t, "POST", "http://orders/", strings.NewReader("x")))
		if err != nil || status != 503 {
			t.Fatalf("POST = %d, %v; want the 503", status, err)
		}
	})
}

func TestTransportOneHTTPTransportPerClient(t *testing.T) {
	b := newBackend(t, "a", nil)
	// A read timeout of its own for stock, longer than the default: a
	// short one would fail requests that a loaded machine answers late.
	stockCfg := balancer.DefaultConfig()
	stockCfg.ReadTimeout = 20 * time.Second
	bs := BalancerMap{
		"orders": newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{b.server("")}),
		"stock":  newBalancer(t, "stock", stockCfg, []balancer.Server{b.server("")}),
	}
	tr := newTestTransport(t, bs)
	hc := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			url := "http://orders/"
			if i%2 == 1 {
				url = "http://stock/"
			}
			if status, _, err := testutil.Do(hc, newRequest(t, "GET", url, nil)); err != nil || status != 200 {
				t.Errorf("GET %s = %d, %v", url, status, err)
			}
		})
	}
	wg.Wait()
	rts := map[string]*http.Transport{}
	tr.clients.Range(func(k, v any) bool {
		rts[k.(string)] = v.(*client).rt
		return true
	})
	if len(rts) != 2 || rts["orders"] == rts["stock"] {
		t.Fatalf("transports: %v; want one per client", rts)
	}
	if got := rts["stock"].ResponseHeaderTimeout; got != stockCfg.ReadTimeout {
		t.Errorf("stock ResponseHeaderTimeout = %v, want its ReadTimeout", got)
	}
	if rts["orders"].MaxIdleConnsPerHost < 100 || rts["orders"].Proxy != nil {
		t.Errorf("orders pool: MaxIdleConnsPerHost %d, Proxy set %v", rts["orders"].MaxIdleConnsPerHost, rts["orders"].Proxy != nil)
	}

	// A new balancer for a name with the same timeouts keeps the pool.
	before := rts["orders"]
	bs["orders"] = newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{b.server("")})
	if got := tr.clientFor("orders", bs["orders"]).rt; got != before {
		t.Errorf("same timeouts, new balancer: transport replaced")
	}
}

func TestTransportConcurrentStatsSettle(t *testing.T) {
	backends := []*backend{newBackend(t, "a", nil), newBackend(t, "b", nil), newBackend(t, "c", nil)}
	var servers []balancer.Server
	for _, b := range backends {
		servers = append(servers, b.server(""))
	}
	servers = append(servers, refusing(t, "dead"))
	lb := newBalancer(t, "orders", roundRobin(), servers)
	tr := newTestTransport(t, BalancerMap{"orders": lb})
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 20 {
				if status, _, err := testutil.Do(client, newRequest(t, "GET", "http://orders/", nil)); err != nil || status != 200 {
					t.Errorf("GET = %d, %v", status, err)
					return
				}
			}
		})
	}
	wg.Wait()
	var total int64
	for _, b := range backends {
		total += b.hits.Load()
		if a := lb.ServerStats(b.id).ActiveRequests(); a != 0 {
			t.Errorf("%s: %d active after all requests", b.id, a)
		}
	}
	if total != 32*20 {
		t.Errorf("backends served %d requests, want %d", total, 32*20)
	}
	if a := lb.ServerStats("dead").ActiveRequests(); a != 0 {
		t.Errorf("dead: %d active", a)
	}
}

func TestTransportCancelledRequestIsNotAServerFailure(t *testing.T) {
	started := make(chan struct{})
	slow := newBackend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
	})
	good := newBackend(t, "good", nil)
	cfg := balancer.DefaultConfig()
	cfg.ReadTimeout = 5 * time.Second
	lb := newBalancer(t, "orders", cfg, []balancer.Server{slow.server(""), good.server("")}, balancer.WithRule(script("slow", "good")))
	tr := newTestTransport(t, BalancerMap{"orders": lb})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders/", nil)
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("RoundTrip = %v; want context.Canceled", err)
	}
	if good.hits.Load() != 0 {
		t.Errorf("a cancelled request was retried")
	}
	if st := lb.ServerStats("slow"); st.SuccessiveFailures() != 0 || st.ActiveRequests() != 0 {
		t.Errorf("slow: %d failures, %d active; want 0, 0", st.SuccessiveFailures(), st.ActiveRequests())
	}
}

func TestNewTransportOptions(t *testing.T) {
	bs := BalancerMap{}
	for name, opts := range map[string][]Option{
		"nil option":      {nil},
		"nil template":    {WithTransportTemplate(nil)},
		"bad status code": {WithRetryOnStatus(503, 99)},
	} {
		if _, err := NewTransport(bs, opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", name, err)
		}
	}
	if _, err := NewTransport(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil Balancers: %v", err)
	}
}

func TestTransportTemplate(t *testing.T) {
	b := newBackend(t, "a", nil)
	tmpl := &http.Transport{MaxIdleConnsPerHost: 7, DisableCompression: true}
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", balancer.DefaultConfig(), []balancer.Server{b.server("")})},
		WithTransportTemplate(tmpl))
	if _, _, err := testutil.Do(&http.Client{Transport: tr}, newRequest(t, "GET", "http://orders/", nil)); err != nil {
		t.Fatal(err)
	}
	v, _ := tr.clients.Load("orders")
	rt := v.(*client).rt
	if rt.MaxIdleConnsPerHost != 7 || !rt.DisableCompression || rt.ResponseHeaderTimeout != time.Second || rt.DialContext == nil {
		t.Errorf("clone of the template: %+v", rt)
	}
	if tmpl.DialContext != nil || tmpl.ResponseHeaderTimeout != 0 {
		t.Errorf("template modified")
	}
}

// closeCounter is a request body without GetBody that counts its closes.
type closeCounter struct {
	io.Reader
	closes atomic.Int32
}

func (c *closeCounter) Close() error {
	c.closes.Add(1)
	return nil
}

func TestTransportClosesUnreplayableBodyOnce(t *testing.T) {
	good := newBackend(t, "good", nil)
	for name, servers := range map[string][]balancer.Server{
		"retried after a refused connection": {refusing(t, "dead"), good.server("")},
		"every server refused":               {refusing(t, "dead"), refusing(t, "dead2")},
	} {
		t.Run(name, func(t *testing.T) {
			lb := newBalancer(t, "orders", balancer.DefaultConfig(), servers, balancer.WithRule(script("dead", servers[1].ID)))
			tr := newTestTransport(t, BalancerMap{"orders": lb})
			body := &closeCounter{Reader: strings.NewReader("hello")}
			req := newRequest(t, "POST", "http://orders/", body)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
			// The attempts' transports may close their bodies after
			// RoundTrip returns: once every one has, nothing can close the
			// caller's body again.
			testutil.Eventually(t, "every attempt's body closed", func() bool { return tr.openGuards.Load() == 0 })
			if n := body.closes.Load(); n != 1 {
				t.Errorf("body closed %d times, want once", n)
			}
		})
	}
}
