package lbhttp

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// hintRule records the zone and key of each pick's context and picks the
// first candidate.
type hintRule struct {
	mu         sync.Mutex
	zone, key  string
	zoned, has bool
}

func (r *hintRule) Choose(p balancer.PickInfo) (*balancer.Server, error) {
	r.mu.Lock()
	r.zone, r.zoned = balancer.ZoneFrom(p.Ctx)
	r.key, r.has = p.Key()
	r.mu.Unlock()
	return p.Candidates.Servers()[0], nil
}

func (r *hintRule) seen() (zone string, zoned bool, key string, has bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.zone, r.zoned, r.key, r.has
}

func TestProxyHints(t *testing.T) {
	orders := newBackend(t, "orders-1", nil)
	rule := &hintRule{}
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", balancer.DefaultConfig(),
		[]balancer.Server{orders.server("a")}, balancer.WithRule(rule))})
	opts := []ProxyOption{
		WithHints(Hints{ZoneHeader: "X-Zone", HashKey: HashKey{Header: "X-User"}}),
		WithRoutes(
			Route{Prefix: "/c", Service: "orders", Hints: Hints{HashKey: HashKey{Cookie: "SESSION"}}},
			Route{Prefix: "/q", Service: "orders", Hints: Hints{ZoneHeader: "X-Other-Zone", HashKey: HashKey{Query: "user"}}},
			Route{Prefix: "/ip", Service: "orders", Hints: Hints{HashKey: HashKey{ClientIP: true}}},
			Route{Prefix: "/plain", Service: "orders"},
		),
	}
	front, client := newFront(t, tr, opts...)

	tests := []struct {
		name, path string
		header     []string // name, value pairs
		zone, key  string   // "" for none
	}{
		{name: "default rule: zone and key headers", path: "/orders/x", header: []string{"X-Zone", "b", "X-User", "u1"}, zone: "b", key: "u1"},
		{name: "default rule: no hint in the request", path: "/orders/x"},
		{name: "default rule: empty header values", path: "/orders/x", header: []string{"X-Zone", "", "X-User", ""}},
		{name: "cookie key, zone header inherited", path: "/c/x", header: []string{"Cookie", "a=1; SESSION=s-42", "X-Zone", "a"}, zone: "a", key: "s-42"},
		{name: "cookie absent", path: "/c/x", header: []string{"Cookie", "a=1", "X-User", "u1"}},
		{name: "query key, own zone header", path: "/q/x?user=u7&user=u8", header: []string{"X-Zone", "a", "X-Other-Zone", "c"}, zone: "c", key: "u7"},
		{name: "client address", path: "/ip/x", header: []string{"X-Forwarded-For", "6.6.6.6", "X-User", "u1"}, key: "127.0.0.1"},
		{name: "route without hints inherits them", path: "/plain/x", header: []string{"X-Zone", "b", "X-User", "u2"}, zone: "b", key: "u2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newRequest(t, "GET", front.URL+tc.path, nil)
			for i := 0; i < len(tc.header); i += 2 {
				req.Header.Set(tc.header[i], tc.header[i+1])
			}
			if status, body, err := testutil.Do(client, req); err != nil || status != 200 {
				t.Fatalf("GET %s = %d %q, %v", tc.path, status, body, err)
			}
			zone, zoned, key, has := rule.seen()
			if zoned != (tc.zone != "") || zone != tc.zone {
				t.Errorf("zone %q (%v), want %q", zone, zoned, tc.zone)
			}
			if has != (tc.key != "") || key != tc.key {
				t.Errorf("key %q (%v), want %q", key, has, tc.key)
			}
			// The hints travel on to the service as they came.
			if tc.zone != "" && orders.last.Load().Header.Get("X-Zone") == "" && orders.last.Load().Header.Get("X-Other-Zone") == "" {
				t.Errorf("the zone header was not forwarded")
			}
		})
	}
}

// The zone hint steers to the zone while it has a usable server, and
// equal keys go to the same server under Rendezvous.
func TestProxyHintsSteerTheBalancer(t *testing.T) {
	a1, a2, b1 := newBackend(t, "a1", nil), newBackend(t, "a2", nil), newBackend(t, "b1", nil)
	cfg := balancer.DefaultConfig()
	cfg.Rule = balancer.RuleRendezvous
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", cfg,
		[]balancer.Server{a1.server("a"), a2.server("a"), b1.server("b")})})
	front, client := newFront(t, tr, WithHints(Hints{ZoneHeader: "X-Zone", HashKey: HashKey{Header: "X-User"}}))
	get := func(zone, user string) string {
		req := newRequest(t, "GET", front.URL+"/orders/", nil)
		if zone != "" {
			req.Header.Set("X-Zone", zone)
		}
		if user != "" {
			req.Header.Set("X-User", user)
		}
		status, body, err := testutil.Do(client, req)
		if err != nil || status != 200 {
			t.Fatalf("GET = %d %q, %v", status, body, err)
		}
		return body
	}
	for range 10 {
		if got := get("B", ""); got != "b1" {
			t.Fatalf("zone B reached %s", got)
		}
	}
	first := map[string]string{}
	for range 3 {
		for i := range 20 {
			user := "user-" + string(rune('a'+i))
			got := get("", user)
			if prev, ok := first[user]; ok && prev != got {
				t.Fatalf("%s went to %s, then to %s", user, prev, got)
			}
			first[user] = got
		}
	}
	spread := map[string]bool{}
	for _, s := range first {
		spread[s] = true
	}
	if len(spread) < 2 {
		t.Fatalf("20 keys all went to %v", spread)
	}
}

func TestHintsValidate(t *testing.T) {
	for _, tc := range []struct {
		h    Hints
		want string // "" for valid
	}{
		{Hints{}, ""},
		{Hints{ZoneHeader: "X-Zone", HashKey: HashKey{Cookie: "JSESSIONID"}}, ""},
		{Hints{HashKey: HashKey{Query: "user id"}}, ""},
		{Hints{ZoneHeader: "X Zone"}, `zoneHeader "X Zone" is not a valid header name`},
		{Hints{HashKey: HashKey{Header: "X:User"}}, `hashKey.header "X:User"`},
		{Hints{HashKey: HashKey{Cookie: "a=b"}}, `hashKey.cookie "a=b"`},
		{Hints{HashKey: HashKey{Header: "X-User", ClientIP: true}}, "set one of header, cookie, query or clientIP, not 2"},
	} {
		err := tc.h.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.h, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrInvalidOption saying %q", tc.h, err, tc.want)
		}
	}
	if _, err := NewProxy(http.DefaultTransport, WithRoutes(Route{Prefix: "/x", Service: "x", Hints: Hints{ZoneHeader: "a b"}})); !errors.Is(err, ErrInvalidOption) ||
		!strings.Contains(err.Error(), `route "/x": zoneHeader`) {
		t.Errorf("a route with a bad hint: %v", err)
	}
	if _, err := NewProxy(http.DefaultTransport, WithHints(Hints{ZoneHeader: "a b"})); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("bad default hints: %v", err)
	}
}
