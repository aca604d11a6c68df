package pushlbxds_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbxds "github.com/pushlb/pushlb/xds"
)

// The binaries the tests run: announce (the main module's), this module's
// gateway, and xdsprobe (a grpc-go xDS client configured by the
// environment, as an application is).
var bin struct{ announce, gateway, probe string }

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(paths []string) { bin.announce, bin.gateway, bin.probe = paths[0], paths[1], paths[2] },
		"github.com/pushlb/pushlb/cmd/announce", "./cmd/gateway", "./internal/xdsprobe"))
}

// grpcServer is a real gRPC server with the standard health service on
// 127.0.0.1, stopped at cleanup. last is the time of the last RPC it
// served (unix nanoseconds), calls counts them.
type grpcServer struct {
	addr  string
	gs    *grpc.Server
	last  atomic.Int64
	calls atomic.Int64
}

func startGRPCServer(t testing.TB) *grpcServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &grpcServer{addr: ln.Addr().String()}
	s.gs = grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.last.Store(time.Now().UnixNano())
		s.calls.Add(1)
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(s.gs, health.NewServer())
	go s.gs.Serve(ln)
	t.Cleanup(s.gs.Stop)
	return s
}

// startClient starts a pushlb client on srv, closed at cleanup; it
// follows every service unless cfg says otherwise.
func startClient(t testing.TB, srv *natstest.Server, cfg pushlb.Config) *pushlb.Client {
	t.Helper()
	if cfg.Follow == "" {
		cfg.Follow = pushlb.FollowAll
	}
	c, err := pushlb.New(srv.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startXDS serves xDS over c on a loopback port until the test ends and
// returns the server and its address.
func startXDS(t testing.TB, c *pushlb.Client, opts ...pushlbxds.Option) (*pushlbxds.Server, string) {
	t.Helper()
	s, err := pushlbxds.NewServer(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// bootstrap is grpc-go's xDS bootstrap for a client of node id in zone
// ("" for none) of the server at addr: the JSON docs/xds.md shows.
func bootstrap(addr, id, zone string) string {
	return fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": {"id": %q, "locality": {"zone": %q}}
}`, addr, id, zone)
}

// xdsConn dials target ("xds:///orders") with grpc-go's xDS resolver, on a
// bootstrap of its own pointing at the server at addr: a test process
// cannot give each test its GRPC_XDS_BOOTSTRAP_CONFIG (grpc-go reads it
// once, at init), so the in-process clients use grpc-go's resolver built
// from a given bootstrap; the gateway test runs a client configured by the
// environment. The connection is closed at cleanup.
func xdsConn(t testing.TB, addr, zone, target string) *grpc.ClientConn {
	t.Helper()
	b, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap(addr, "test-"+zone, zone)))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithResolvers(b), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// check makes one health RPC and returns the address of the server that
// answered.
func check(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	return p.Addr.String(), nil
}

// reachesAll waits until RPCs on conn have reached every one of addrs.
func reachesAll(t testing.TB, conn *grpc.ClientConn, what string, addrs ...string) {
	t.Helper()
	seen := map[string]bool{}
	testutil.Eventually(t, what, func() bool {
		if addr, err := check(conn); err == nil {
			seen[addr] = true
		}
		for _, a := range addrs {
			if !seen[a] {
				return false
			}
		}
		return true
	})
}

// onlyReaches waits until n RPCs in a row reach one of addrs, then checks
// that 50 more do: the client's list no longer holds any other server.
func onlyReaches(t testing.TB, conn *grpc.ClientConn, what string, n int, addrs ...string) {
	t.Helper()
	in := func(a string) bool {
		for _, x := range addrs {
			if a == x {
				return true
			}
		}
		return false
	}
	testutil.Eventually(t, what, func() bool {
		for range n {
			if addr, err := check(conn); err != nil || !in(addr) {
				return false
			}
		}
		return true
	})
	for i := range 50 {
		if addr, err := check(conn); err != nil || !in(addr) {
			t.Fatalf("%s: RPC %d afterwards reached %s (%v), want one of %v", what, i, addr, err, addrs)
		}
	}
}

// announceProc registers addr as an instance of service in zone with a
// real announce process (no drain: the tests time the offline itself).
func announceProc(t testing.TB, natsURL, service, zone, addr string, meta ...string) *testutil.Proc {
	t.Helper()
	args := []string{"-nats", natsURL, "-service", service, "-addr", addr, "-zone", zone, "-drain", "0s"}
	for _, m := range meta {
		args = append(args, "-meta", m)
	}
	p := testutil.Start(t, bin.announce, args...)
	p.WaitFor(t, "announced online", 10*time.Second)
	return p
}

// TestXDSClientFollowsAnnouncedInstances: real gRPC servers registered by
// real announce processes; grpc-go's xDS client on "xds:///orders"
// reaches each of them, reaches one added later, and stops reaching one
// whose announce process stopped (its offline). No client rejects a
// response.
func TestXDSClientFollowsAnnouncedInstances(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	a, b, added := startGRPCServer(t), startGRPCServer(t), startGRPCServer(t)
	announceProc(t, srv.URL(), "orders", "z1", a.addr)
	pb := announceProc(t, srv.URL(), "orders", "z1", b.addr)
	x, addr := startXDS(t, c)
	conn := xdsConn(t, addr, "", "xds:///orders")
	reachesAll(t, conn, "both instances", a.addr, b.addr)

	before := x.Stats().ListUpdates
	announceProc(t, srv.URL(), "orders", "z1", added.addr)
	reachesAll(t, conn, "the added instance", a.addr, b.addr, added.addr)
	if st := x.Stats(); st.ListUpdates <= before || st.Services != 1 {
		t.Fatalf("stats after the addition %+v", st)
	}

	if code := pb.Stop(t, 10*time.Second); code != 0 {
		t.Fatalf("announce exited %d", code)
	}
	// b keeps serving: once the client's list lacks it, no RPC reaches it.
	onlyReaches(t, conn, "b's offline to reach the client", 6, a.addr, added.addr)
	if st := x.Stats(); st.NACKs != 0 || st.InvalidResources != 0 || st.DroppedInstances != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestZoneFailover: a client in z1 sends to z1 only (priority 0); when
// z1's server stops answering, it fails over to z2 (priority 1) before any
// list change; when z1 has an instance again, it returns to it. A client
// without a zone, and one of a zone no instance has, balance over both
// zones.
func TestZoneFailover(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	nc := srv.Connect(t)
	a, b := startGRPCServer(t), startGRPCServer(t)
	pa := testpub.AnnounceAddr(t, nc, "orders", "z1", "orders-a", a.addr)
	testpub.AnnounceAddr(t, nc, "orders", "Z2", "orders-b", b.addr)
	testutil.Eventually(t, "both listed", func() bool { bal, err := c.Balancer("orders"); return err == nil && len(bal.Servers()) == 2 })
	x, addr := startXDS(t, c)

	inZ1 := xdsConn(t, addr, "Z1", "xds:///orders") // zones compare without regard to case
	onlyReaches(t, inZ1, "z1's client in z1", 1, a.addr)
	reachesAll(t, xdsConn(t, addr, "", "xds:///orders"), "a client without a zone in both zones", a.addr, b.addr)
	reachesAll(t, xdsConn(t, addr, "z9", "xds:///orders"), "a client of another zone in both zones", a.addr, b.addr)

	// a stops answering, still listed: grpc-go's priority policy moves to
	// priority 1 once priority 0 fails.
	a.gs.Stop()
	onlyReaches(t, inZ1, "the failover to z2", 3, b.addr)

	// a's offline, and a new instance in z1: back to z1.
	if err := pa.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	a2 := startGRPCServer(t)
	testpub.AnnounceAddr(t, nc, "orders", "z1", "orders-a2", a2.addr)
	onlyReaches(t, inZ1, "z1's new instance", 3, a2.addr)
	if st := x.Stats(); st.ClientZones != 2 || st.NACKs != 0 {
		t.Fatalf("stats %+v: want 2 client zones (z1, z9), no NACK", st)
	}
}

// TestOptionsAndLifecycle: bad options are errors naming them; Serve
// after Stop says so; Stop twice is harmless.
func TestOptionsAndLifecycle(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	if _, err := pushlbxds.NewServer(nil); !errors.Is(err, pushlbxds.ErrInvalidOption) {
		t.Fatalf("nil client: %v", err)
	}
	_, err := pushlbxds.NewServer(c, pushlbxds.WithMaxClientZones(-1), nil, pushlbxds.WithGRPCServerOptions(nil))
	if !errors.Is(err, pushlbxds.ErrInvalidOption) || !strings.Contains(err.Error(), "WithMaxClientZones(-1)") ||
		!strings.Contains(err.Error(), "option 1 is nil") || !strings.Contains(err.Error(), "WithGRPCServerOptions") {
		t.Fatalf("bad options: %v", err)
	}
	s, err := pushlbxds.NewServer(c)
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := s.Serve(ln); !errors.Is(err, pushlbxds.ErrStopped) {
		t.Fatalf("Serve after Stop: %v", err)
	}
}

// TestServiceAnnouncedLater: a client that asked for a service nobody
// announced yet (the server answers without its listener; grpc-go waits
// for it up to its resource timer, 15 s, then fails RPCs with
// UNAVAILABLE) reaches the service once an instance announces it.
func TestServiceAnnouncedLater(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	x, addr := startXDS(t, c)
	conn := xdsConn(t, addr, "", "xds:///later")
	conn.Connect()
	testutil.Eventually(t, "the client's stream", func() bool { return x.Stats().Streams == 1 })
	s := startGRPCServer(t)
	testpub.AnnounceAddr(t, srv.Connect(t), "later", "", "later-1", s.addr)
	reachesAll(t, conn, "the announced instance", s.addr)
}

// TestBadInstancesAreLeftOutAndCounted: an instance whose address another
// instance of the service has (grpc-go would reject the whole assignment)
// is left out, and a weight that is not a whole number is ignored; both
// are counted, the client gets a valid assignment and reaches the service.
func TestBadInstancesAreLeftOutAndCounted(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	x, addr := startXDS(t, c)
	s, other := startGRPCServer(t), startGRPCServer(t)
	nc := srv.Connect(t)
	testpub.AnnounceAddr(t, nc, "orders", "", "orders-old", s.addr)
	testpub.AnnounceAddr(t, nc, "orders", "", "orders-new", s.addr)
	announceProc(t, srv.URL(), "orders", "", other.addr, "weight=heavy")
	conn := xdsConn(t, addr, "", "xds:///orders")
	reachesAll(t, conn, "both addresses", s.addr, other.addr)
	testutil.Eventually(t, "the drop and the bad weight counted", func() bool {
		st := x.Stats()
		return st.DroppedInstances > 0 && st.BadWeights > 0
	})
	if st := x.Stats(); st.NACKs != 0 || st.InvalidResources != 0 {
		t.Fatalf("stats %+v", st)
	}
}
