package pushlbgrpc

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/balancer"
	_ "google.golang.org/grpc/balancer/leastrequest" // grpc-go's least_request: the anchor that counts RPCs
	_ "google.golang.org/grpc/balancer/roundrobin"   // grpc-go's round_robin, the anchor
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
)

// fakeCC is the ClientConn a balancer is built on in the pick benchmarks:
// SubConns that become READY when asked to connect (state changes queued
// and delivered after the call that caused them, as grpc-go's serializer
// does), and the last picker the balancer published.
type fakeCC struct {
	balancer.ClientConn
	mu      sync.Mutex
	pending []func()
	state   balancer.State
}

type fakeSC struct {
	balancer.SubConn
	cc       *fakeCC
	listener func(balancer.SubConnState)
}

func (cc *fakeCC) NewSubConn(_ []resolver.Address, o balancer.NewSubConnOptions) (balancer.SubConn, error) {
	return &fakeSC{cc: cc, listener: o.StateListener}, nil
}
func (cc *fakeCC) RemoveSubConn(balancer.SubConn)                       {}
func (cc *fakeCC) UpdateAddresses(balancer.SubConn, []resolver.Address) {}
func (cc *fakeCC) ResolveNow(resolver.ResolveNowOptions)                {}
func (cc *fakeCC) Target() string                                       { return "bench" }
func (cc *fakeCC) UpdateState(s balancer.State) {
	cc.mu.Lock()
	cc.state = s
	cc.mu.Unlock()
}

func (cc *fakeCC) queue(f func()) {
	cc.mu.Lock()
	cc.pending = append(cc.pending, f)
	cc.mu.Unlock()
}

// settle delivers queued state changes until none is left.
func (cc *fakeCC) settle() {
	for {
		cc.mu.Lock()
		p := cc.pending
		cc.pending = nil
		cc.mu.Unlock()
		if len(p) == 0 {
			return
		}
		for _, f := range p {
			f()
		}
	}
}

func (sc *fakeSC) Connect() {
	sc.cc.queue(func() {
		sc.listener(balancer.SubConnState{ConnectivityState: connectivity.Connecting})
		sc.listener(balancer.SubConnState{ConnectivityState: connectivity.Ready})
	})
}
func (sc *fakeSC) UpdateAddresses([]resolver.Address) {}
func (sc *fakeSC) Shutdown()                          {}
func (sc *fakeSC) RegisterHealthListener(f func(balancer.SubConnState)) {
	sc.cc.queue(func() { f(balancer.SubConnState{ConnectivityState: connectivity.Ready}) })
}

// builtPicker builds the named balancer over n READY endpoints spread over
// zones zones (as the pushlb resolver describes them; with hints, every
// fourth one with metadata hint=canary) and returns its picker.
func builtPicker(tb testing.TB, name, config string, n, zones int, hints bool) balancer.Picker {
	tb.Helper()
	bb := balancer.Get(name)
	if bb == nil {
		tb.Fatalf("no balancer %q", name)
	}
	cc := &fakeCC{}
	b := bb.Build(cc, balancer.BuildOptions{Target: resolver.Target{}})
	tb.Cleanup(b.Close)
	eps := make([]resolver.Endpoint, n)
	for i := range eps {
		var md metadataAttr
		if hints && i%4 == 0 {
			md = metadataAttr{"hint": "canary"}
		}
		attrs := attributes.New(instanceIDKey{}, "i"+strconv.Itoa(i)).WithValue(zoneKey{}, "z"+strconv.Itoa(i%zones)).WithValue(metadataKey{}, md)
		eps[i] = resolver.Endpoint{Addresses: []resolver.Address{{Addr: fmt.Sprintf("10.%d.%d.%d:80", i>>16&255, i>>8&255, i&255)}}, Attributes: attrs}
	}
	ccs := balancer.ClientConnState{ResolverState: resolver.State{Endpoints: eps, Attributes: attributes.New(clientZoneKey{}, "")}}
	if config != "" {
		parser := bb.(balancer.ConfigParser)
		lbc, err := parser.ParseConfig([]byte(config))
		if err != nil {
			tb.Fatal(err)
		}
		ccs.BalancerConfig = lbc
	}
	if err := b.UpdateClientConnState(ccs); err != nil {
		tb.Fatal(err)
	}
	cc.settle()
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.state.ConnectivityState != connectivity.Ready {
		tb.Fatalf("%s: state %v after settling", name, cc.state.ConnectivityState)
	}
	return cc.state.Picker
}

func pickLoop(b *testing.B, p balancer.Picker) { pickLoopCtx(b, p, context.Background()) }

// pickLoopCtx picks in parallel for RPCs made with ctx.
func pickLoopCtx(b *testing.B, p balancer.Picker, ctx context.Context) {
	info := balancer.PickInfo{FullMethodName: "/grpc.health.v1.Health/Check", Ctx: ctx}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := p.Pick(info)
			if err != nil {
				b.Fatal(err)
			}
			if res.Done != nil {
				res.Done(balancer.DoneInfo{})
			}
		}
	})
}

// BenchmarkPick compares, in one run, a pick and its Done through grpc-go's
// round_robin, through grpc-go's least_request (two choices), and through
// the pushlb balancer (RoundRobin and ZoneAvoidance rules), over N READY
// endpoints in 1 or 3 zones. round_robin records nothing per RPC;
// least_request counts each endpoint's RPCs in flight (an atomic add in
// Pick, one in Done, and a Done closure per pick), as pushlb counts its
// statistics. Run by bench/grpc.sh with -cpu 1,2.
func BenchmarkPick(b *testing.B) {
	RegisterBalancer()
	for _, n := range []int{3, 10000} {
		for _, zones := range []int{1, 3} {
			for _, c := range []struct{ name, policy, config string }{
				{"grpc-round_robin", "round_robin", ""},
				{"grpc-least_request", "least_request_experimental", `{"choiceCount":2}`},
				{"pushlb-RoundRobin", Name, `{"rule":"RoundRobin"}`},
				{"pushlb-ZoneAvoidance", Name, `{"rule":"ZoneAvoidance"}`},
			} {
				var p balancer.Picker // built once: 10,000 endpoints take seconds
				outer := b            // which closes it: a closed balancer is not what runs
				b.Run(fmt.Sprintf("N=%d/zones=%d/%s", n, zones, c.name), func(b *testing.B) {
					if p == nil {
						p = builtPicker(outer, c.policy, c.config, n, zones, true)
						// The build's garbage (10,000 endpoints: hundreds
						// of MB) is collected before the picks are timed.
						runtime.GC()
					}
					pickLoop(b, p)
				})
			}
		}
	}
}

// BenchmarkPickHint compares, in one run, the pushlb pick (RoundRobin, 3
// and 1,000 endpoints in one zone) with the hint key off ("hintKey":"-":
// the pick as it was before hints), with the default hint key and no
// hint (an RPC without metadata, and one whose metadata carries another
// key; the latter also over endpoints none of which carries a hint, where
// the picker skips the metadata), and with a hint in the metadata or on
// the context (a quarter of the endpoints carry it). The pickers are built
// before any is timed.
func BenchmarkPickHint(b *testing.B) {
	RegisterBalancer()
	bare := context.Background()
	other := metadata.AppendToOutgoingContext(bare, "x-user", "u1")
	for _, n := range []int{3, 1000} {
		off := builtPicker(b, Name, `{"rule":"RoundRobin","hintKey":"-"}`, n, 1, true)
		on := builtPicker(b, Name, `{"rule":"RoundRobin"}`, n, 1, true)
		unhinted := builtPicker(b, Name, `{"rule":"RoundRobin"}`, n, 1, false)
		for _, c := range []struct {
			name string
			p    balancer.Picker
			ctx  context.Context
		}{
			{"off/no-metadata", off, bare},
			{"on/no-metadata", on, bare},
			{"off/other-metadata", off, other},
			{"on/other-metadata", on, other},
			{"on/other-metadata/no-hinted-endpoint", unhinted, other},
			{"on/hint-in-metadata", on, metadata.AppendToOutgoingContext(other, DefaultHintKey, "canary")},
			{"on/hint-on-context", on, WithCallHint(other, "canary")},
		} {
			b.Run(fmt.Sprintf("N=%d/%s", n, c.name), func(b *testing.B) { pickLoopCtx(b, c.p, c.ctx) })
		}
	}
}

// BenchmarkBuild measures building a balancer over N endpoints that all
// connect: every connectivity change is one UpdateState.
func BenchmarkBuild(b *testing.B) {
	RegisterBalancer()
	for _, n := range []int{1000, 2000} {
		for _, c := range []struct{ name, policy, config string }{
			{"grpc-round_robin", "round_robin", ""},
			{"pushlb-RoundRobin", Name, `{"rule":"RoundRobin"}`},
		} {
			b.Run(fmt.Sprintf("N=%d/%s", n, c.name), func(b *testing.B) {
				for b.Loop() {
					builtPicker(b, c.policy, c.config, n, 3, true)
				}
			})
		}
	}
}
