package pushlbcaddy_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/balancer"
	pushlbcaddy "github.com/pushlb/pushlb/caddy"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// fleet announces n instances of service at made-up addresses (nothing
// is dialled here), every fourth one with metadata hint=canary.
func fleet(b *testing.B, nc *nats.Conn, service string, n int) {
	for i := range n {
		in := serverlist.Instance{Service: service, InstanceID: fmt.Sprintf("%s-%d", service, i), Zone: fmt.Sprintf("z%d", i%3)}
		if i%4 == 0 {
			in.Metadata = map[string]string{balancer.HintKey: "canary"}
		}
		testpub.AnnounceAt(b, nc, fmt.Sprintf("127.0.0.1:%d", 20000+i), in)
	}
}

// BenchmarkRequestPath is the work the pushlb modules add to one request
// through reverse_proxy, as Caddy calls them: GetUpstreams, Select, and
// the report of the attempt when the request ends. Sizes of the fleet,
// under the pushlb policy (the source hands over the picked instances)
// and under another policy (the source hands over a copy of the list;
// Caddy's least_conn then scans it).
func BenchmarkRequestPath(b *testing.B) {
	// What every iteration below spends outside the modules: a request
	// with Caddy's context (replacer, variables), cancelled.
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r := request(nil)
			ctx, cancel := context.WithCancel(r.Context())
			answered(r.WithContext(ctx))
			cancel()
		}
	})
	srv := natstest.Start(b)
	nc := srv.Connect(b)
	for _, n := range []int{4, 1000} {
		service := fmt.Sprintf("svc%d", n)
		fleet(b, nc, service, n)
		u := &pushlbcaddy.Upstreams{Service: service, Zone: "z1", ClientConfig: pushlbcaddy.ClientConfig{NATS: []string{srv.URL()}}}
		if err := u.Provision(caddyContextB(b)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { u.Cleanup() })
		testutil.Eventually(b, "the fleet", func() bool {
			ups, _ := u.GetUpstreams(request(nil))
			return len(ups) == n
		})
		sel := &pushlbcaddy.Selection{}
		if err := sel.Provision(caddyContextB(b)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { sel.Cleanup() })
		sel.Select(mustUpstreams(b, u, request(nil)), request(nil), nil) // the source learns the policy
		for _, hint := range []string{"", "canary"} {
			name := "pushlb"
			if hint != "" {
				name = "pushlb-hinted"
			}
			b.Run(fmt.Sprintf("%s/N=%d", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					r := request(nil)
					if hint != "" {
						r.Header.Set(pushlbcaddy.DefaultHintHeader, hint)
					}
					ctx, cancel := context.WithCancel(r.Context())
					r = r.WithContext(ctx)
					if sel.Select(mustUpstreams(b, u, r), r, nil) == nil {
						b.Fatal("no upstream")
					}
					answered(r)
					cancel()
				}
			})
		}
		least := reverseproxy.LeastConnSelection{}
		other := &pushlbcaddy.Upstreams{Service: service, ClientConfig: pushlbcaddy.ClientConfig{NATS: []string{srv.URL()}}}
		if err := other.Provision(caddyContextB(b)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { other.Cleanup() })
		b.Run(fmt.Sprintf("least_conn/N=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := request(nil)
				pool := mustUpstreams(b, other, r)
				for _, up := range pool {
					up.Host = host // as Caddy's provisioning does
				}
				if least.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
			}
		})
	}
}

var host = new(reverseproxy.Host)

// answered sets what reverse_proxy sets once an upstream answered.
func answered(r *http.Request) {
	r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer).Set("http.reverse_proxy.status_code", 200)
}

func mustUpstreams(b *testing.B, u *pushlbcaddy.Upstreams, r *http.Request) []*reverseproxy.Upstream {
	ups, err := u.GetUpstreams(r)
	if err != nil || len(ups) == 0 {
		b.Fatalf("GetUpstreams: %d, %v", len(ups), err)
	}
	return ups
}

// BenchmarkSelectStatic is the pushlb policy over a static pool (the
// policy's own balancer) against Caddy's least_conn, Select alone.
func BenchmarkSelectStatic(b *testing.B) {
	for _, n := range []int{4, 1000} {
		pool := make([]*reverseproxy.Upstream, n)
		for i := range pool {
			pool[i] = &reverseproxy.Upstream{Dial: fmt.Sprintf("127.0.0.1:%d", 20000+i), Host: new(reverseproxy.Host)}
		}
		sel := &pushlbcaddy.Selection{Rule: "BestAvailable"}
		if err := sel.Provision(caddyContextB(b)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { sel.Cleanup() })
		b.Run(fmt.Sprintf("pushlb-BestAvailable/N=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := request(nil)
				ctx, cancel := context.WithCancel(r.Context())
				r = r.WithContext(ctx)
				if sel.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
				answered(r)
				cancel()
			}
		})
		least := reverseproxy.LeastConnSelection{}
		b.Run(fmt.Sprintf("least_conn/N=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if least.Select(pool, request(nil), nil) == nil {
					b.Fatal("no upstream")
				}
			}
		})
	}
}
