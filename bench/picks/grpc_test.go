package picks

import (
	"fmt"
	"sync"
	"testing"

	"google.golang.org/grpc/balancer"
	_ "google.golang.org/grpc/balancer/roundrobin" // registers round_robin
	"google.golang.org/grpc/connectivity"
	estats "google.golang.org/grpc/experimental/stats"
	"google.golang.org/grpc/resolver"
)

// grpcCC is the smallest balancer.ClientConn that lets grpc-go's real
// round_robin policy (endpointsharding over one pickfirst per endpoint)
// reach READY without a network: every SubConn it creates reports
// CONNECTING then READY when asked to connect, and healthy when a health
// listener is registered. The events are queued and run by drain, outside
// the calls of the SubConn's own balancer into the ClientConn, as grpc's
// serializer would. NewSubConn drains the events of the endpoints created
// before it: they then happen while endpointsharding builds its children,
// when it holds back the aggregated picker, so reaching READY costs O(N)
// rather than one O(N) picker rebuild per endpoint (27 s at N=10,000).
type grpcCC struct {
	balancer.ClientConn // grpc requires the interface embedded

	mu      sync.Mutex
	pending []func()
	state   balancer.State
}

func (cc *grpcCC) queue(f func()) {
	cc.mu.Lock()
	cc.pending = append(cc.pending, f)
	cc.mu.Unlock()
}

// drain runs queued events, and those they queue, until none is left.
func (cc *grpcCC) drain() {
	for {
		cc.mu.Lock()
		work := cc.pending
		cc.pending = nil
		cc.mu.Unlock()
		if len(work) == 0 {
			return
		}
		for _, f := range work {
			f()
		}
	}
}

func (cc *grpcCC) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	cc.drain()
	return &grpcSubConn{cc: cc, listener: opts.StateListener}, nil
}

func (cc *grpcCC) RemoveSubConn(balancer.SubConn)                       {}
func (cc *grpcCC) UpdateAddresses(balancer.SubConn, []resolver.Address) {}
func (cc *grpcCC) ResolveNow(resolver.ResolveNowOptions)                {}
func (cc *grpcCC) Target() string                                       { return "bench" }
func (cc *grpcCC) MetricsRecorder() estats.MetricsRecorder              { return noMetrics{} }
func (cc *grpcCC) UpdateState(s balancer.State)                         { cc.mu.Lock(); cc.state = s; cc.mu.Unlock() }
func (cc *grpcCC) current() balancer.State                              { cc.mu.Lock(); defer cc.mu.Unlock(); return cc.state }
func (sc *grpcSubConn) UpdateAddresses([]resolver.Address)              {}
func (sc *grpcSubConn) Shutdown()                                       {}
func (sc *grpcSubConn) GetOrBuildProducer(balancer.ProducerBuilder) (balancer.Producer, func()) {
	return nil, func() {}
}

type noMetrics struct {
	estats.UnimplementedMetricsRecorder
}

type grpcSubConn struct {
	balancer.SubConn // grpc requires the interface embedded

	cc       *grpcCC
	listener func(balancer.SubConnState)
}

func (sc *grpcSubConn) Connect() {
	sc.cc.queue(func() {
		sc.listener(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
		sc.listener(balancer.SubConnState{ConnectivityState: connectivity.Ready})
	})
}

func (sc *grpcSubConn) RegisterHealthListener(l func(balancer.SubConnState)) {
	sc.cc.queue(func() { l(balancer.SubConnState{ConnectivityState: connectivity.Ready}) })
}

// grpcRoundRobin builds grpc-go's round_robin over n endpoints, drives
// every SubConn to READY and returns the picker it published.
func grpcRoundRobin(b *testing.B, n int) balancer.Picker {
	b.Helper()
	cc := &grpcCC{}
	bal := balancer.Get("round_robin").Build(cc, balancer.BuildOptions{})
	b.Cleanup(bal.Close)
	eps := make([]resolver.Endpoint, n)
	for i := range eps {
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: addr(i)}}}
	}
	if err := bal.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps}}); err != nil {
		b.Fatal(err)
	}
	cc.drain()
	st := cc.current()
	if st.ConnectivityState != connectivity.Ready {
		b.Fatalf("grpc round_robin: state %v, want READY", st.ConnectivityState)
	}
	// Every endpoint must be in the rotation.
	seen := map[balancer.SubConn]bool{}
	for range 2 * n {
		res, err := st.Picker.Pick(balancer.PickInfo{FullMethodName: "/bench.S/M"})
		if err != nil {
			b.Fatal(err)
		}
		seen[res.SubConn] = true
	}
	if len(seen) != n {
		b.Fatalf("grpc round_robin: %d SubConns picked, want %d", len(seen), n)
	}
	return st.Picker
}

func addr(i int) string {
	return fmt.Sprintf("10.%d.%d.%d:8080", i/65536, i/256%256, i%256)
}
