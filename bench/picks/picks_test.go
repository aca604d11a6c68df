package picks

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	grpcbal "google.golang.org/grpc/balancer"

	"github.com/pushlb/pushlb/balancer"
)

// sizes are the list sizes of every contender.
var sizes = []int{3, 100, 1000, 10000}

// keys is how many distinct keys the keyed picks cycle through (a power of
// two), so that lookups do not all hit one cache line.
const keys = 1024

// BenchmarkPicks measures one pick of each contender, serially, N by N so
// that the peers run side by side. Every list is healthy and idle.
//
//   - grpc/round_robin: grpc-go's real round_robin policy (endpointsharding
//     over pickfirst children), its published Picker.Pick;
//   - caddy/*: caddy's reverseproxy selection policies, Select over an
//     UpstreamPool of available upstreams (IPHash over 1,024 client
//     addresses);
//   - pushlb/*: Balancer.Choose through the public API, default config
//     (ZonePreference filter, zone-aware) but for the rule, servers spread
//     over three zones, or one zone for RoundRobin_1zone; Maglev keyed over
//     1,024 keys.
func BenchmarkPicks(b *testing.B) {
	for _, n := range sizes {
		picker := grpcRoundRobin(b, n)
		info := grpcbal.PickInfo{FullMethodName: "/bench.S/M", Ctx: context.Background()}
		run(b, "grpc/round_robin", n, func(int) bool {
			res, err := picker.Pick(info)
			return err == nil && res.SubConn != nil
		})

		pool := caddyPool(n)
		reqs := caddyRequests()
		for _, c := range []struct {
			name string
			sel  reverseproxy.Selector
		}{
			{"RoundRobin", &reverseproxy.RoundRobinSelection{}},
			{"LeastConn", reverseproxy.LeastConnSelection{}},
			{"Random", reverseproxy.RandomSelection{}},
			{"IPHash", reverseproxy.IPHashSelection{}},
		} {
			run(b, "caddy/"+c.name, n, func(i int) bool {
				return c.sel.Select(pool, reqs[i&(keys-1)], nil) != nil
			})
		}

		plain := []context.Context{context.Background()}
		for _, p := range []struct {
			name  string
			rule  string
			zones int
			ctxs  []context.Context
		}{
			{"RoundRobin_1zone", balancer.RuleRoundRobin, 1, plain},
			{"RoundRobin_3zones", balancer.RuleRoundRobin, 3, plain},
			{"ZoneAvoidance_3zones", balancer.RuleZoneAvoidance, 3, plain},
			{"Random_3zones", balancer.RuleRandom, 3, plain},
			{"BestAvailable_3zones", balancer.RuleBestAvailable, 3, plain},
			{"LeastRequest_3zones", balancer.RuleLeastRequest, 3, plain},
			{"Maglev_3zones_keyed", balancer.RuleMaglev, 3, keyCtxs()},
		} {
			bal := pushlbBalancer(b, p.rule, n, p.zones)
			run(b, "pushlb/"+p.name, n, func(i int) bool {
				s, err := bal.Choose(p.ctxs[i&(len(p.ctxs)-1)])
				return err == nil && s != nil
			})
		}
	}
}

// run runs one contender's pick as two sub-benchmarks: name/N=n/serial,
// one goroutine, and name/N=n/parallel, GOMAXPROCS goroutines picking from
// the same balancer (run with -cpu 1,2: what shared cache lines cost
// shows at 2). pick gets an iteration's index and reports whether it
// chose; it must be safe for concurrent use.
func run(b *testing.B, name string, n int, pick func(i int) bool) {
	b.Run(fmt.Sprintf("%s/N=%d/serial", name, n), func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if !pick(i) {
				b.Fatal("no pick")
			}
			i++
		}
	})
	b.Run(fmt.Sprintf("%s/N=%d/parallel", name, n), func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if !pick(i) {
					b.Error("no pick")
					return
				}
				i++
			}
		})
	})
}

// caddyPool is n available upstreams, as caddy's reverse_proxy holds them
// after provisioning (each with its Host state).
func caddyPool(n int) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: addr(i)}
		if !pool[i].Available() {
			panic("caddy upstream not available")
		}
	}
	return pool
}

// caddyRequests are requests from 1,024 client addresses, for IPHash.
func caddyRequests() []*http.Request {
	out := make([]*http.Request, keys)
	for i := range out {
		r, err := http.NewRequest(http.MethodGet, "http://gw/svc/", nil)
		if err != nil {
			panic(err)
		}
		r.RemoteAddr = fmt.Sprintf("192.0.%d.%d:%d", i/256, i%256, 40000+i)
		out[i] = r
	}
	return out
}

// pushlbBalancer builds a balancer of rule over n servers spread over
// zones zones, default config but for the rule, through the public API,
// with one response time recorded per server as in pushlb's own
// benchmarks.
func pushlbBalancer(b *testing.B, rule string, n, zones int) *balancer.Balancer {
	b.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Rule = rule
	bal, err := balancer.New("bench", cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bal.Close() })
	list := make([]balancer.Server, n)
	for i := range list {
		list[i] = balancer.Server{ID: fmt.Sprintf("i-%d", i), Host: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256), Port: 8080, Zone: string(rune('a' + i%zones))}
	}
	if err := bal.SetServers(list); err != nil {
		b.Fatal(err)
	}
	for i, s := range bal.AllServers() {
		bal.Begin(s).Done(balancer.DoneInfo{ResponseTime: time.Duration(i%50+1) * 100 * time.Microsecond})
	}
	// Those requests changed active counts after the zone decision was
	// made: until it is remade, ZoneStatsInterval later, a Choose reads the
	// clock to see whether it is due. Pick until then, so that the steady
	// state is measured rather than the first tenth of a second.
	for end := time.Now().Add(cfg.ZoneStatsInterval); time.Now().Before(end); {
		if _, err := bal.Choose(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	return bal
}

// keyCtxs are contexts with 1,024 distinct keys.
func keyCtxs() []context.Context {
	out := make([]context.Context, keys)
	for i := range out {
		out[i] = balancer.WithKey(context.Background(), fmt.Sprintf("user-%d", i))
	}
	return out
}
