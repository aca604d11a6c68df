package pushlbgrpc_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	"github.com/pushlb/pushlb"
	pushlbgrpc "github.com/pushlb/pushlb/grpc"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// bin holds the binaries the process tests run.
var bin struct{ announce, testserver string }

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(paths []string) { bin.announce, bin.testserver = paths[0], paths[1] },
		"github.com/pushlb/pushlb/cmd/announce", "./internal/testserver"))
}

// grpcServer serves the standard health service on 127.0.0.1 until the
// test ends, and returns its address.
func grpcServer(t *testing.T) string { return newTestServer(t).addr }

// startClient starts a pushlb client on srv, closed at cleanup.
func startClient(t testing.TB, srv *natstest.Server) *pushlb.Client {
	t.Helper()
	return startClientWith(t, srv, pushlb.Config{})
}

// startClientWith starts a pushlb client with cfg on srv, closed at cleanup.
func startClientWith(t testing.TB, srv *natstest.Server, cfg pushlb.Config) *pushlb.Client {
	t.Helper()
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

// roundRobin is the service config of grpc-go's round_robin.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// dial opens a ClientConn to target through the pushlb resolver, with the
// service config given ("" for grpc-go's default, pick_first), closed at
// cleanup.
func dial(t *testing.T, c *pushlb.Client, target, serviceConfig string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithResolvers(pushlbgrpc.NewBuilder(c)), grpc.WithTransportCredentials(insecure.NewCredentials())}
	if serviceConfig != "" {
		opts = append(opts, grpc.WithDefaultServiceConfig(serviceConfig))
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// check makes one health RPC and returns the address of the server that
// answered.
func check(conn *grpc.ClientConn) (string, error) { return checkCtx(context.Background(), conn) }

// TestResolverFollowsTheService: a grpc-go ClientConn on "pushlb:///orders"
// reaches every announced instance, stops reaching a withdrawn one from
// the list change on, and fails at once when none is left. Real gRPC
// servers, a real NATS server, no polling.
func TestResolverFollowsTheService(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	nc := srv.Connect(t)
	a, b := grpcServer(t), grpcServer(t)
	pa := testpub.AnnounceAddr(t, nc, "orders", "z1", "orders-a", a)
	pb := testpub.AnnounceAddr(t, nc, "orders", "z2", "orders-b", b)
	conn := dial(t, c, "pushlb:///orders", roundRobin)

	seen := map[string]bool{}
	testutil.Eventually(t, "both instances answering", func() bool {
		if addr, err := check(conn); err == nil {
			seen[addr] = true
		}
		return seen[a] && seen[b]
	})

	if err := pa.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	// Once the list no longer holds a, no RPC reaches it.
	testutil.Eventually(t, "a's withdrawal to reach the ClientConn", func() bool {
		for range 10 {
			if addr, err := check(conn); err != nil || addr != b {
				return false
			}
		}
		return true
	})
	for i := range 50 {
		if addr, err := check(conn); err != nil || addr != b {
			t.Fatalf("RPC %d after the withdrawal: %s, %v; want %s", i, addr, err, b)
		}
	}

	// No instance left: RPCs fail at once with Unavailable. grpc-go's
	// round_robin says "no children to pick from"; pick_first (the default
	// policy) passes on the resolver's error, which names the service.
	first := dial(t, c, "pushlb:///orders", "")
	if addr, err := check(first); err != nil || addr != b {
		t.Fatalf("pick_first before the last withdrawal: %s, %v", addr, err)
	}
	if err := pb.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	var last error
	testutil.Eventually(t, "round_robin's RPCs to fail", func() bool {
		_, last = check(conn)
		return status.Code(last) == codes.Unavailable
	})
	t.Logf("round_robin with no instance: %v", last)
	testutil.Eventually(t, "pick_first's RPCs to fail naming the service", func() bool {
		_, last = check(first)
		return status.Code(last) == codes.Unavailable && strings.Contains(last.Error(), `no instances of "orders"`)
	})
	t.Logf("pick_first with no instance: %v", last)
}

// recordingConn is a resolver.ClientConn that keeps every state and error
// the resolver hands it, to read the attributes.
type recordingConn struct {
	resolver.ClientConn
	mu     sync.Mutex
	states []resolver.State
	errs   []error
}

func (r *recordingConn) UpdateState(s resolver.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = append(r.states, s)
	return nil
}

func (r *recordingConn) ReportError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *recordingConn) ParseServiceConfig(string) *serviceconfig.ParseResult { return nil }

func (r *recordingConn) last() (resolver.State, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.states) == 0 {
		return resolver.State{}, r.errs
	}
	return r.states[len(r.states)-1], r.errs
}

// TestResolverStateCarriesTheInstances: each endpoint and address names
// its instance, zone and metadata; an unknown service is resolved as no
// instance (not an error of Build), and an invalid name is.
func TestResolverStateCarriesTheInstances(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	builder := pushlbgrpc.NewBuilder(c)
	if builder.Scheme() != "pushlb" {
		t.Fatalf("scheme %q", builder.Scheme())
	}
	rc := &recordingConn{}
	r, err := builder.Build(resolver.Target{URL: *mustParse(t, "pushlb:///orders")}, rc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Nothing announced yet: once the client found no instance of it, no
	// addresses, and an error naming the service.
	testutil.Eventually(t, "the resolver's first answer", func() bool { _, errs := rc.last(); return len(errs) > 0 })
	if st, errs := rc.last(); len(st.Endpoints) != 0 || len(errs) != 1 || !errors.Is(errs[0], pushlbgrpc.ErrNoInstances) {
		t.Fatalf("before any instance: state %+v, errors %v", st, errs)
	}
	addr := grpcServer(t)
	testpub.AnnounceAddr(t, srv.Connect(t), "orders", "z1", "orders-1", addr)
	var st resolver.State
	testutil.Eventually(t, "the instance resolved", func() bool { st, _ = rc.last(); return len(st.Endpoints) == 1 })
	ep := st.Endpoints[0]
	if id, ok := pushlbgrpc.InstanceID(ep.Attributes); !ok || id != "orders-1" || pushlbgrpc.Zone(ep.Attributes) != "z1" ||
		len(ep.Addresses) != 1 || ep.Addresses[0].Addr != addr || len(st.Addresses) != 1 || st.Addresses[0].Addr != addr {
		t.Fatalf("state %+v", st)
	}
	if id, _ := pushlbgrpc.InstanceID(st.Addresses[0].Attributes); id != "orders-1" {
		t.Fatalf("address attributes %v", st.Addresses[0].Attributes)
	}
	if _, err := builder.Build(resolver.Target{URL: *mustParse(t, "pushlb:///bad.name")}, rc, resolver.BuildOptions{}); err == nil {
		t.Fatal("an invalid service name must fail Build")
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// signalConn is a resolver.ClientConn that sends the number of endpoints
// of each state it gets.
type signalConn struct {
	resolver.ClientConn
	states chan int
}

func (s *signalConn) UpdateState(st resolver.State) error { s.states <- len(st.Endpoints); return nil }
func (s *signalConn) ReportError(error)                   {}

// BenchmarkWithdrawalToResolverState: from an instance's Withdraw (its
// offline event, then its record's removal) to the resolver state without
// it, through a real NATS server and the client's push path: the time a
// grpc-go ClientConn keeps a gone instance. Each withdrawal follows its
// announcement at once, inside the default 10 ms coalescing window; the
// client here coalesces nothing, which measures the path of a change after
// a quiet period (applied at once with the default too).
func BenchmarkWithdrawalToResolverState(b *testing.B) {
	srv := natstest.Start(b)
	c := startClientWith(b, srv, pushlb.Config{Coalesce: time.Nanosecond})
	nc := srv.Connect(b)
	testpub.AnnounceAddr(b, nc, "orders", "", "orders-stays", "127.0.0.1:1")
	sc := &signalConn{states: make(chan int, 64)}
	r, err := pushlbgrpc.NewBuilder(c).Build(resolver.Target{URL: url.URL{Scheme: "pushlb", Path: "/orders"}}, sc, resolver.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	waitFor := func(n int) {
		for got := range sc.states {
			if got == n {
				return
			}
		}
	}
	waitFor(1)
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		p := testpub.AnnounceAddr(b, nc, "orders", "", "orders-"+strconv.Itoa(i), "127.0.0.1:2")
		waitFor(2)
		b.StartTimer()
		began := time.Now()
		if err := p.Withdraw(b.Context(), "bench"); err != nil {
			b.Fatal(err)
		}
		waitFor(1)
		lat = append(lat, time.Since(began))
	}
	b.ReportMetric(float64(testutil.Percentile(lat, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(testutil.Percentile(lat, 0.99).Microseconds()), "p99-µs")
}
