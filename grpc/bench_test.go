package pushlbgrpc_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/pushlb/pushlb"
	pushlbgrpc "github.com/pushlb/pushlb/grpc"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// BenchmarkRPCs measures unary RPCs per second over the same three
// in-process servers, in one run: grpc-go's round_robin over a static list
// (the manual resolver, as passthrough with several addresses), the pushlb
// resolver with round_robin, and the pushlb resolver with the pushlb
// balancer. The ratio of the last to the first is the cost of pushlb on
// the RPC path (goal >= 0.95x).
func BenchmarkRPCs(b *testing.B) {
	srv := natstest.Start(b)
	c := startClient(b, srv)
	nc := srv.Connect(b)
	var addrs []resolver.Address
	for i := range 3 {
		ts := newTestServer(b)
		addrs = append(addrs, resolver.Address{Addr: ts.addr})
		testpub.AnnounceAddr(b, nc, "orders", "z1", fmt.Sprint("o", i), ts.addr)
	}
	static := manual.NewBuilderWithScheme("static")
	static.InitialState(resolver.State{Addresses: addrs})
	for _, cs := range []struct {
		name, target, sc string
		opt              grpc.DialOption
	}{
		{"static+round_robin", "static:///orders", roundRobin, grpc.WithResolvers(static)},
		{"pushlb+round_robin", "pushlb:///orders", roundRobin, grpc.WithResolvers(pushlbgrpc.NewBuilder(c))},
		{"pushlb+pushlb-RoundRobin", "pushlb:///orders", pushlbConfig(`{"rule":"RoundRobin"}`, false), grpc.WithResolvers(pushlbgrpc.NewBuilder(c))},
		{"pushlb+pushlb-ZoneAvoidance", "pushlb:///orders", pushlbConfig(`{}`, false), grpc.WithResolvers(pushlbgrpc.NewBuilder(c))},
	} {
		b.Run(cs.name, func(b *testing.B) {
			conn, err := grpc.NewClient(cs.target, cs.opt, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(cs.sc))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			for range 3 { // connect
				if _, err := hc.Check(b.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
					b.Fatal(err)
				}
			}
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkWithdrawalToLastRPC measures, under steady RPC load through the
// pushlb resolver and balancer, the time from an instance's withdrawal
// (publisher.Withdraw, over its own NATS connection) to the last RPC that
// server answered (0 when none came after the withdrawal began): the
// graceful path of a deploy, end to end.
func BenchmarkWithdrawalToLastRPC(b *testing.B) {
	srv := natstest.Start(b)
	c := startClientWith(b, srv, pushlb.Config{Coalesce: time.Nanosecond})
	nc := srv.Connect(b)
	for i := range 2 {
		testpub.AnnounceAddr(b, nc, "orders", "z1", fmt.Sprint("stays-", i), newTestServer(b).addr)
	}
	conn := dialPushlb(b, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"RoundRobin"}`, false))
	var answered atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := checkCtx(ctx, conn); err == nil {
					answered.Add(1)
				}
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	var view pushlb.Balancer
	testutil.Eventually(b, "the service's balancer", func() bool {
		v, err := c.Balancer("orders")
		view = v
		return err == nil
	})
	var lat []time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		ts := newTestServer(b)
		id := fmt.Sprint("leaves-", i)
		p := testpub.AnnounceAddr(b, nc, "orders", "z1", id, ts.addr)
		testutil.Eventually(b, "the new server to take RPCs", func() bool { return ts.served.Load() > 0 })
		b.StartTimer()
		began := time.Now()
		if err := p.Withdraw(b.Context(), "bench"); err != nil {
			b.Fatal(err)
		}
		testutil.Eventually(b, "the withdrawal to apply", func() bool { return view.Server(id) == nil })
		// The picker that still had it is replaced at once; 300 more
		// answers elsewhere make sure it was.
		mark := answered.Load()
		testutil.Eventually(b, "300 RPCs after the withdrawal", func() bool { return answered.Load() > mark+300 })
		b.StopTimer()
		lat = append(lat, max(0, time.Duration(ts.lastServed.Load()-began.UnixNano())))
		ts.srv.Stop()
	}
	b.ReportMetric(float64(testutil.Percentile(lat, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(testutil.Percentile(lat, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(testutil.Percentile(lat, 1).Microseconds()), "max-µs")
}
