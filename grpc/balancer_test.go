package pushlbgrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/pushlb/pushlb"
	lb "github.com/pushlb/pushlb/balancer"
	pushlbgrpc "github.com/pushlb/pushlb/grpc"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func init() { pushlbgrpc.RegisterBalancer() }

// pushlbConfig is a service config naming the pushlb balancer with cfg
// (a JSON object), and a retry policy for Unavailable when retry is set.
func pushlbConfig(cfg string, retry bool) string {
	sc := `{"loadBalancingConfig":[{"pushlb":` + cfg + `}]`
	if retry {
		sc += `,"methodConfig":[{"name":[{"service":"grpc.health.v1.Health"}],"retryPolicy":{"maxAttempts":4,"initialBackoff":"0.01s","maxBackoff":"0.05s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]`
	}
	return sc + `}`
}

func TestParseConfig(t *testing.T) {
	cfg, err := pushlbgrpc.ParseConfig(json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if def := lb.DefaultConfig(); cfg.Balancer.Rule != def.Rule || cfg.Balancer.Filter != def.Filter || cfg.Balancer.Breaker != def.Breaker {
		t.Fatalf("empty config: %+v, want the defaults", cfg.Balancer)
	}
	cfg, err = pushlbgrpc.ParseConfig(json.RawMessage(`{"rule":"BestAvailable","zone":"a","breaker":{"threshold":5,"factor":"2s"},"hashKey":"X-User"}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Balancer.Rule != "BestAvailable" || cfg.Balancer.Zone != "a" || cfg.Balancer.Breaker.Threshold != 5 ||
		cfg.Balancer.Breaker.Factor != 2*time.Second || cfg.Balancer.Breaker.Max != 30*time.Second || cfg.HashKey != "x-user" {
		t.Fatalf("config: %+v hashKey %q", cfg.Balancer, cfg.HashKey)
	}
	for js, want := range map[string]string{
		`{"rule":"Nope"}`:                      "Nope",
		`{"connectTimeout":"1s"}`:              `"connectTimeout"`,
		`{"breaker":{"threshold":-1}}`:         "breaker.threshold",
		`{"breaker":{"thresold":1}}`:           "thresold",
		`{"hashKey":3}`:                        "hashKey",
		`[1]`:                                  "service config",
		`{"zoneAffinity":{"enabled":"maybe"}}`: "zoneAffinity.enabled",
	} {
		if _, err := pushlbgrpc.ParseConfig(json.RawMessage(js)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %s", js, err, want)
		}
	}
	// grpc-go refuses a service config whose pushlb part is bad.
	if _, err := grpc.NewClient("passthrough:///x", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(pushlbConfig(`{"rule":"Nope"}`, false))); err == nil {
		t.Error("a bad pushlb config was accepted by grpc.NewClient")
	}
}

// testServer is a real gRPC server with the health service, whose
// behaviour a test switches: drop makes the handler close the server's
// connections instead of answering (the client receives nothing, as from
// a server that crashes or resets: a connection failure), appErr makes it
// answer with an Unavailable status (an application error: the server
// answered).
type testServer struct {
	addr            string
	drop, appErr    atomic.Bool
	served, dropped atomic.Int64
	lastServed      atomic.Int64 // UnixNano of the last RPC answered
	srv             *grpc.Server
	conns           *connTracker
}

// connTracker is a listener that keeps the connections it accepted, to
// close them from the server's side.
type connTracker struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *connTracker) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *connTracker) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

type flakyHealth struct {
	*health.Server
	ts *testServer
}

func (h flakyHealth) Check(ctx context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.ts.drop.Load() {
		h.ts.dropped.Add(1)
		h.ts.conns.closeAll()
		return nil, status.Error(codes.Internal, "not sent: the connection is closed")
	}
	if h.ts.appErr.Load() {
		return nil, status.Error(codes.Unavailable, "the application says unavailable")
	}
	h.ts.served.Add(1)
	h.ts.lastServed.Store(time.Now().UnixNano())
	return h.Server.Check(ctx, r)
}

func newTestServer(t testing.TB) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{addr: ln.Addr().String(), conns: &connTracker{Listener: ln}}
	ts.srv = grpc.NewServer()
	healthpb.RegisterHealthServer(ts.srv, flakyHealth{health.NewServer(), ts})
	go ts.srv.Serve(ts.conns)
	t.Cleanup(ts.srv.Stop)
	return ts
}

// dialPushlb opens a ClientConn to target with the pushlb resolver (zone
// given) and the service config.
func dialPushlb(t testing.TB, c *pushlb.Client, target, zone, sc string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target,
		grpc.WithResolvers(pushlbgrpc.NewBuilder(c, pushlbgrpc.WithZone(zone))),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// checkCtx makes one health RPC with ctx and returns who answered.
func checkCtx(ctx context.Context, conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	return p.Addr.String(), nil
}

// spread makes n RPCs and counts the answers per server; any error fails
// the test.
func spread(t testing.TB, ctx context.Context, conn *grpc.ClientConn, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range n {
		addr, err := checkCtx(ctx, conn)
		if err != nil {
			t.Fatalf("RPC %d: %v", i, err)
		}
		seen[addr]++
	}
	return seen
}

// waitReady waits until RPCs reach every address in want.
func waitReady(t testing.TB, conn *grpc.ClientConn, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	testutil.Eventually(t, fmt.Sprintf("RPCs to reach %v", want), func() bool {
		if addr, err := checkCtx(context.Background(), conn); err == nil {
			seen[addr] = true
		}
		for _, w := range want {
			if !seen[w] {
				return false
			}
		}
		return true
	})
}

// TestBalancerRoundRobinOverReadyEndpoints: the RoundRobin rule spreads
// RPCs evenly over the announced servers, and a withdrawn one gets none
// from the list change on.
func TestBalancerRoundRobinOverReadyEndpoints(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	nc := srv.Connect(t)
	servers := []*testServer{newTestServer(t), newTestServer(t), newTestServer(t)}
	var pubs []interface {
		Withdraw(context.Context, string) error
	}
	for i, s := range servers {
		pubs = append(pubs, testpub.AnnounceAddr(t, nc, "orders", "z1", fmt.Sprintf("orders-%d", i), s.addr))
	}
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"RoundRobin"}`, false))
	waitReady(t, conn, servers[0].addr, servers[1].addr, servers[2].addr)
	seen := spread(t, t.Context(), conn, 300)
	for _, s := range servers {
		if n := seen[s.addr]; n != 100 {
			t.Errorf("%s got %d of 300 RPCs, want 100 (round robin): %v", s.addr, n, seen)
		}
	}
	if err := pubs[0].Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the withdrawal to reach the balancer", func() bool {
		return spread(t, t.Context(), conn, 6)[servers[0].addr] == 0
	})
	if seen := spread(t, t.Context(), conn, 100); seen[servers[0].addr] != 0 || seen[servers[1].addr] != 50 {
		t.Fatalf("after the withdrawal: %v", seen)
	}
}

// TestBalancerZones: as in the gateway, the client's zone is preferred
// (ZonePreference, the default filter), a zone forced per call wins while
// it has a server, and when the preferred zone's last server goes the
// RPCs fail over to the other zone without failing.
func TestBalancerZones(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	nc := srv.Connect(t)
	a1, b1, b2 := newTestServer(t), newTestServer(t), newTestServer(t)
	pa := testpub.AnnounceAddr(t, nc, "orders", "a", "a1", a1.addr)
	testpub.AnnounceAddr(t, nc, "orders", "b", "b1", b1.addr)
	testpub.AnnounceAddr(t, nc, "orders", "b", "b2", b2.addr)
	testutil.Eventually(t, "the three instances", func() bool {
		b, err := c.Follow(t.Context(), "orders") // the client follows what it is asked for

		return err == nil && len(b.Servers()) == 3
	})
	for _, rule := range []string{"ZoneAvoidance", "RoundRobin", "BestAvailable"} {
		t.Run(rule, func(t *testing.T) {
			// From the first RPC on: a new ClientConn waits for its zone's
			// connection rather than use another zone's, READY sooner.
			conn := dialPushlb(t, c, "pushlb:///orders", "a", pushlbConfig(`{"rule":"`+rule+`"}`, false))
			if seen := spread(t, t.Context(), conn, 50); seen[a1.addr] != 50 {
				t.Fatalf("zone a preferred: %v", seen)
			}
			if seen := spread(t, pushlbgrpc.WithCallZone(t.Context(), "b"), conn, 50); seen[a1.addr] != 0 {
				t.Fatalf("zone b forced per call: %v", seen)
			}
			// The service config's zone wins over the resolver's.
			other := dialPushlb(t, c, "pushlb:///orders", "a", pushlbConfig(`{"rule":"`+rule+`","zone":"b"}`, false))
			waitReady(t, other, b1.addr)
			if seen := spread(t, t.Context(), other, 50); seen[a1.addr] != 0 {
				t.Fatalf("zone b from the service config: %v", seen)
			}
		})
	}
	// Zone a's only server leaves: its RPCs go to zone b, none fails.
	conn := dialPushlb(t, c, "pushlb:///orders", "a", pushlbConfig(`{}`, true))
	waitReady(t, conn, a1.addr)
	if err := pa.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	a1.srv.GracefulStop()
	testutil.Eventually(t, "zone b to take the RPCs", func() bool {
		seen := spread(t, t.Context(), conn, 4)
		return seen[b1.addr]+seen[b2.addr] == 4
	})
}

// badAndGood starts a client over an in-process NATS server and two test
// servers announced as instances "bad" and "good" of orders in zone z1.
func badAndGood(t *testing.T) (c *pushlb.Client, bad, good *testServer) {
	t.Helper()
	srv := natstest.Start(t)
	c = startClient(t, srv)
	nc := srv.Connect(t)
	bad, good = newTestServer(t), newTestServer(t)
	testpub.AnnounceAddr(t, nc, "orders", "z1", "bad", bad.addr)
	testpub.AnnounceAddr(t, nc, "orders", "z1", "good", good.addr)
	return c, bad, good
}

// unavailable makes n RPCs and counts those that failed with Unavailable.
func unavailable(t *testing.T, conn *grpc.ClientConn, n int) int {
	t.Helper()
	errs := 0
	for range n {
		if _, err := checkCtx(t.Context(), conn); status.Code(err) == codes.Unavailable {
			errs++
		}
	}
	return errs
}

// TestBalancerBreaker: connect failures reported through Done trip the
// server's breaker, which keeps RPCs off it; it recovers once the server
// answers again. An application error status (the server answered) does
// not trip it.
func TestBalancerBreaker(t *testing.T) {
	c, bad, good := badAndGood(t)

	// AvailabilityFiltering: round robin over the servers whose breaker is
	// closed (Ribbon's RoundRobin ignores breakers). A long blackout: a
	// trip shows as RPCs that stay off the server.
	const long = `{"rule":"AvailabilityFiltering","breaker":{"threshold":3,"factor":"1h","max":"1h"}}`
	noRetry := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(long, false))
	waitReady(t, noRetry, bad.addr, good.addr)
	bad.appErr.Store(true)
	appErrs := unavailable(t, noRetry, 40)
	bad.appErr.Store(false)
	if appErrs != 20 {
		t.Fatalf("%d of 40 RPCs met the application error, want 20 (round robin)", appErrs)
	}
	if seen := spread(t, t.Context(), noRetry, 40); seen[bad.addr] != 20 {
		t.Fatalf("after %d application errors the server gets %d of 40 RPCs, want 20: an answer must not trip the breaker", appErrs, seen[bad.addr])
	}

	// Dropped connections: the client received nothing, which is a
	// connection failure. Three trip the breaker, which keeps RPCs off the
	// server although it reconnects at once (READY again); the retries go
	// to the good server.
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(long, true))
	waitReady(t, conn, bad.addr, good.addr)
	bad.drop.Store(true)
	before := bad.dropped.Load()
	if seen := spread(t, t.Context(), conn, 200); seen[good.addr] != 200 {
		t.Fatalf("RPCs with retries while bad drops them: %v", seen)
	}
	if n := bad.dropped.Load() - before; n != 3 {
		t.Fatalf("bad got %d of 200 RPCs while dropping them: the breaker should have stopped them after 3", n)
	}

	// With a short blackout, the breaker lets a probe through after it,
	// and the server is back once it answers.
	recovering := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"AvailabilityFiltering","breaker":{"threshold":3,"factor":"50ms","max":"50ms"}}`, true))
	waitReady(t, recovering, good.addr)
	before = bad.dropped.Load()
	testutil.Eventually(t, "the dropped RPCs to trip the breaker", func() bool {
		spread(t, t.Context(), recovering, 4)
		return bad.dropped.Load()-before >= 3
	})
	bad.drop.Store(false)
	testutil.Eventually(t, "the recovered server to get RPCs again", func() bool {
		return spread(t, t.Context(), recovering, 10)[bad.addr] > 0
	})
}

// announceServers starts n test servers, announced as the instances
// o0...o<n-1> of orders in zone z1, and returns their addresses.
func announceServers(t *testing.T, nc *nats.Conn, n int) []string {
	t.Helper()
	var addrs []string
	for i := range n {
		s := newTestServer(t)
		addrs = append(addrs, s.addr)
		testpub.AnnounceAddr(t, nc, "orders", "z1", fmt.Sprintf("o%d", i), s.addr)
	}
	return addrs
}

// TestBalancerHashKey: a keyed rule sends the RPCs of one metadata value
// to one server.
func TestBalancerHashKey(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	nc := srv.Connect(t)
	addrs := announceServers(t, nc, 4)
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"Maglev","hashKey":"X-User"}`, false))
	waitReady(t, conn, addrs...)
	servers := map[string]bool{}
	for u := range 20 {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", fmt.Sprint("user-", u))
		seen := spread(t, ctx, conn, 10)
		if len(seen) != 1 {
			t.Fatalf("user %d went to %v", u, seen)
		}
		for a := range seen {
			servers[a] = true
		}
	}
	if len(servers) < 2 {
		t.Fatalf("20 users all on %v", servers)
	}
}

// TestBalancerRollingRestart: four servers restarted one after the other
// (withdraw, drain, stop, a new one announced) under steady RPC load: no
// RPC fails.
func TestBalancerRollingRestart(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	nc := srv.Connect(t)
	type member struct {
		ts  *testServer
		pub interface {
			Withdraw(context.Context, string) error
		}
	}
	var members []member
	for i := range 4 {
		ts := newTestServer(t)
		members = append(members, member{ts, testpub.AnnounceAddr(t, nc, "orders", "z1", fmt.Sprintf("gen0-%d", i), ts.addr)})
	}
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{}`, true))
	waitReady(t, conn, members[0].ts.addr)

	var sent, failed atomic.Int64
	var firstErr atomic.Value
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, err := checkCtx(context.Background(), conn)
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	b, err := c.Balancer("orders")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range members {
		if err := m.pub.Withdraw(t.Context(), "rolling restart"); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the withdrawal to apply", func() bool { return b.Server(fmt.Sprintf("gen0-%d", i)) == nil })
		m.ts.srv.GracefulStop()
		ts := newTestServer(t)
		testpub.AnnounceAddr(t, nc, "orders", "z1", fmt.Sprintf("gen1-%d", i), ts.addr)
		testutil.Eventually(t, "the new server to take RPCs", func() bool { return ts.served.Load() > 0 })
	}
	stop()
	wg.Wait()
	t.Logf("%d RPCs during the rolling restart, %d failed", sent.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d of %d RPCs failed; first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}
	if sent.Load() < 100 {
		t.Fatalf("only %d RPCs sent: no load", sent.Load())
	}
}

// TestBalancerNoInstances: a service without instances fails RPCs at once
// with Unavailable naming it.
func TestBalancerNoInstances(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	conn := dialPushlb(t, c, "pushlb:///payments", "", pushlbConfig(`{}`, false))
	_, err := checkCtx(t.Context(), conn)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `"payments"`) {
		t.Fatalf("RPC to a service without instances: %v, want Unavailable naming it", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("the RPC hung until its deadline")
	}
}

// TestBalancerOutlierEjection: a server whose RPCs answer a server error
// status (its handler's Unavailable) is ejected after five in a row
// (outlierDetection), RoundRobin included, while its breaker stays
// closed: it answers.
func TestBalancerOutlierEjection(t *testing.T) {
	c, bad, good := badAndGood(t)
	const cfg = `{"rule":"RoundRobin","outlierDetection":{"consecutive5xx":5,"baseEjectionTime":"1h","maxEjectionTime":"1h","maxEjectionPercent":50}}`
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(cfg, false))
	waitReady(t, conn, bad.addr, good.addr)
	bad.appErr.Store(true)
	if errs := unavailable(t, conn, 60); errs != 5 {
		t.Fatalf("%d of 60 RPCs met the bad server's errors, want 5: it should be ejected after 5 in a row", errs)
	}
	if seen := spread(t, t.Context(), conn, 40); seen[good.addr] != 40 {
		t.Fatalf("after the ejection: %v, want every RPC on the good server", seen)
	}
}
