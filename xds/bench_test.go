package pushlbxds_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// BenchmarkOfflineToLastRPC: from an instance's offline (publisher
// Withdraw: its offline event, then its record's removal) to the last RPC
// a grpc-go xDS client sends it, with the client sending RPCs back to back
// over round_robin to that instance and one that stays: NATS, the pushlb
// client's push path, this server's feed and caches, the ADS stream and
// grpc-go's xDS client, all real, in one process. The pushlb client
// coalesces nothing (as grpc/'s BenchmarkWithdrawalToResolverState), which
// measures a change after a quiet period (applied at once by the default
// too). The end is proved, not waited for: 4 RPCs in a row to the server
// that stays (round_robin over two alternates).
func BenchmarkOfflineToLastRPC(b *testing.B) {
	srv := natstest.Start(b)
	c := startClient(b, srv, pushlb.Config{Coalesce: time.Nanosecond})
	nc := srv.Connect(b)
	stays, goes := startGRPCServer(b), startGRPCServer(b)
	testpub.AnnounceAddr(b, nc, "orders", "", "orders-stays", stays.addr)
	x, addr := startXDS(b, c)
	conn := xdsConn(b, addr, "", "xds:///orders")

	pub := newPublisher(b, nc)
	host, port, _ := net.SplitHostPort(goes.addr)
	portNum, _ := strconv.Atoi(port)

	// The load: RPCs back to back; streak counts those in a row that
	// reached the server that stays.
	var streak atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if a, err := check(conn); err == nil && a == stays.addr {
				streak.Add(1)
			} else {
				streak.Store(0)
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()

	// When the client's own list lost the instance: the push path's share.
	var listed atomic.Int64 // unix nanos of the last list without a goes instance
	stopWatch := c.Watch("orders", func(servers []*balancer.Server) {
		if len(servers) == 1 {
			listed.Store(time.Now().UnixNano())
		}
	})
	defer stopWatch()

	var lat, push []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		in := serverlist.Instance{Service: "orders", InstanceID: "orders-goes-" + strconv.Itoa(i), Host: host, Port: portNum}
		if err := pub.Announce(b.Context(), in); err != nil {
			b.Fatal(err)
		}
		calls := goes.calls.Load()
		testutil.Eventually(b, "RPCs to the announced instance", func() bool { return goes.calls.Load() > calls+2 })
		b.StartTimer()
		began := time.Now()
		if err := pub.Withdraw(b.Context(), "bench"); err != nil {
			b.Fatal(err)
		}
		testutil.Eventually(b, "the client to stop sending to it", func() bool { return streak.Load() >= 4 })
		lat = append(lat, max(0, time.Unix(0, goes.last.Load()).Sub(began)))
		push = append(push, time.Unix(0, listed.Load()).Sub(began))
	}
	b.ReportMetric(float64(testutil.Percentile(lat, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(testutil.Percentile(lat, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(testutil.Percentile(lat, 1).Microseconds()), "max-µs")
	b.ReportMetric(float64(testutil.Percentile(push, 0.50).Microseconds()), "list-p50-µs")
	b.ReportMetric(float64(testutil.Percentile(push, 0.99).Microseconds()), "list-p99-µs")
	if st := x.Stats(); st.NACKs != 0 {
		b.Fatalf("stats %+v", st)
	}
}

// BenchmarkOfflineToEDSResponse: from an instance's offline (publisher
// Withdraw) to the ClusterLoadAssignment without it on a raw ADS stream
// (state of the world, as Envoy's): the control plane's share of the path,
// without grpc-go's client, decoding and validating the response
// included. The pushlb client coalesces nothing, as in
// BenchmarkOfflineToLastRPC.
func BenchmarkOfflineToEDSResponse(b *testing.B) {
	srv := natstest.Start(b)
	c := startClient(b, srv, pushlb.Config{Coalesce: time.Nanosecond})
	nc := srv.Connect(b)
	testpub.AnnounceAddr(b, nc, "orders", "", "orders-stays", "127.0.0.1:1")
	_, addr := startXDS(b, c)
	ads := openADS(b, addr, "")
	ads.request(resource.EndpointType, []string{"orders"}, nil)
	endpointsOf := func(what string) int {
		r, m := ads.next(what)
		ads.request(resource.EndpointType, []string{"orders"}, r) // ACK
		cla, _ := m["orders"].(*endpointpb.ClusterLoadAssignment) // none while the client has no list
		n := 0
		for _, l := range cla.GetEndpoints() {
			n += len(l.GetLbEndpoints())
		}
		return n
	}
	for endpointsOf("the first assignment") != 1 {
	}
	pub := newPublisher(b, nc)
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		in := serverlist.Instance{Service: "orders", InstanceID: "orders-goes-" + strconv.Itoa(i), Host: "127.0.0.1", Port: 2}
		if err := pub.Announce(b.Context(), in); err != nil {
			b.Fatal(err)
		}
		for endpointsOf("the announced instance") != 2 {
		}
		b.StartTimer()
		// Withdraw returns once the registry removed the record; the
		// offline event may reach the client before: wait for the response
		// meanwhile.
		began := time.Now()
		withdrawn := make(chan error, 1)
		go func() { withdrawn <- pub.Withdraw(context.Background(), "bench") }()
		for endpointsOf("the offline") != 1 {
		}
		lat = append(lat, time.Since(began))
		if err := <-withdrawn; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(testutil.Percentile(lat, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(testutil.Percentile(lat, 0.99).Microseconds()), "p99-µs")
}

// newPublisher opens the registry over nc and returns a publisher on it,
// closed at cleanup.
func newPublisher(b *testing.B, nc *nats.Conn) *publisher.Publisher {
	b.Helper()
	return testpub.New(b, nc, publisher.Config{})
}
