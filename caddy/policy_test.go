package pushlbcaddy_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	pushlbcaddy "github.com/pushlb/pushlb/caddy"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// selection provisions a pushlb policy, cleaned up at the test's end.
func selection(t *testing.T, s *pushlbcaddy.Selection) *pushlbcaddy.Selection {
	t.Helper()
	if err := s.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Cleanup() })
	return s
}

// attempt is one request through the source and the policy, as Caddy's
// reverse_proxy makes it: GetUpstreams, then Select.
type attempt struct {
	pool   []*reverseproxy.Upstream
	chosen *reverseproxy.Upstream
	repl   *caddy.Replacer
	end    context.CancelFunc
}

func try(t *testing.T, u *pushlbcaddy.Upstreams, s *pushlbcaddy.Selection, header http.Header) attempt {
	t.Helper()
	r := request(nil)
	for k, v := range header {
		r.Header[k] = v
	}
	ctx, cancel := context.WithCancel(r.Context())
	r = r.WithContext(ctx)
	pool, err := u.GetUpstreams(r)
	if err != nil {
		t.Fatal(err)
	}
	return attempt{pool: pool, chosen: s.Select(pool, r, nil), repl: ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer), end: cancel}
}

// answered ends the request with an answer from the upstream (the
// placeholder reverse_proxy sets once it has one).
func (a attempt) answered() { a.repl.Set("http.reverse_proxy.status_code", 200); a.end() }

// TestPolicyPrefersTheZoneAndHonoursTheBreaker: under the pushlb policy
// the source hands Caddy the instances pushlb picked (at most three, not
// the list); they are of the source's zone while it has a reachable one;
// an instance whose attempts get no answer trips its breaker after three,
// and the picks go to the other zone.
func TestPolicyPrefersTheZoneAndHonoursTheBreaker(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	u := provision(t, srv, "orders", "a")
	s := selection(t, &pushlbcaddy.Selection{})
	local := testpub.Backend(t, "a1")
	testpub.Announce(t, nc, "orders", "a", local)
	for _, name := range []string{"b1", "b2", "b3"} {
		testpub.Announce(t, nc, "orders", "b", testpub.Backend(t, name))
	}
	testutil.Eventually(t, "four instances", func() bool {
		ups, _ := u.GetUpstreams(request(nil))
		return len(ups) == 4
	})
	localAddr := local.Listener.Addr().String()
	for i := range 20 {
		a := try(t, u, s, nil)
		if a.chosen == nil || a.chosen.Dial != localAddr {
			t.Fatalf("request %d: chose %v, want the zone's %s", i, a.chosen, localAddr)
		}
		if i > 0 && len(a.pool) > 3 {
			t.Fatalf("request %d: the source handed %d upstreams to the pushlb policy, want the picked ones (at most 3)", i, len(a.pool))
		}
		a.answered()
	}
	// The outcomes are reported when each request's context ends, on
	// goroutines of their own: a success reported after a failure would
	// reset its count. Wait for them all.
	testutil.Eventually(t, "the answers reported", func() bool { return pushlbcaddy.Active(u, "orders") == 0 })
	// Three attempts without an answer: the breaker opens.
	for range 3 {
		a := try(t, u, s, nil)
		if a.chosen.Dial != localAddr {
			t.Fatalf("chose %s before the breaker opened", a.chosen.Dial)
		}
		a.end()
	}
	testutil.Eventually(t, "the zone's instance tripped", func() bool { return pushlbcaddy.Reachable(u, "orders") == 3 })
	for i := range 20 {
		a := try(t, u, s, nil)
		if a.chosen == nil || a.chosen.Dial == localAddr {
			t.Fatalf("request %d after the breaker opened: chose %v", i, a.chosen)
		}
		a.answered()
	}
}

// TestPolicyOverOtherPools: over upstreams that do not come from the
// pushlb source (static ones), the policy balances with a balancer of its
// own and the rule it is given.
func TestPolicyOverOtherPools(t *testing.T) {
	s := selection(t, &pushlbcaddy.Selection{Rule: "RoundRobin"})
	pool := []*reverseproxy.Upstream{{Dial: "127.0.0.1:1001"}, {Dial: "127.0.0.1:1002"}, {Dial: "127.0.0.1:1003"}}
	seen := map[string]int{}
	for range 30 {
		r := request(nil)
		u := s.Select(pool, r, nil)
		if u == nil {
			t.Fatal("no upstream chosen")
		}
		seen[u.Dial]++
	}
	for _, u := range pool {
		if seen[u.Dial] != 10 {
			t.Fatalf("round robin over 3 static upstreams, 30 picks: %v", seen)
		}
	}
	if s.Select(nil, request(nil), nil) != nil {
		t.Fatal("an empty pool gave an upstream")
	}
}
