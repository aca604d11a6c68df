package lbhttp

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// versionedBackends starts two v1 backends and one v2 backend (metadata
// hint=canary) of service orders, and returns the balancer entries.
func versionedBackends(t *testing.T) []balancer.Server {
	t.Helper()
	var list []balancer.Server
	for _, b := range []struct{ id, version, hint string }{{"v1-a", "v1", ""}, {"v1-b", "v1", ""}, {"v2-a", "v2", "canary"}} {
		srv := newBackend(t, b.id, nil).server("")
		srv.Metadata = map[string]string{"version": b.version}
		if b.hint != "" {
			srv.Metadata[balancer.HintKey] = b.hint
		}
		list = append(list, srv)
	}
	return list
}

// subsetFront is a proxy over versionedBackends with routes.
type subsetFront struct {
	url    string
	client *http.Client
	mu     sync.Mutex
	seen   map[string]int // service/subset -> requests, from the observer
}

func newSubsetFront(t *testing.T, routes ...Route) *subsetFront {
	t.Helper()
	tr := newTestTransport(t, BalancerMap{"orders": newBalancer(t, "orders", roundRobin(), versionedBackends(t))})
	f := &subsetFront{seen: map[string]int{}}
	front, client := newFront(t, tr, WithRoutes(routes...), WithSubsetRand(testutil.NewRand(7, 8)),
		WithSubsetObserver(func(service, subset string) {
			f.mu.Lock()
			f.seen[service+"/"+subset]++
			f.mu.Unlock()
		}))
	f.url, f.client = front.URL, client
	return f
}

// get sends GET path with header pairs and returns the status and body.
func (f *subsetFront) get(t *testing.T, path string, header ...string) (int, string) {
	t.Helper()
	req := newRequest(t, "GET", f.url+path, nil)
	for i := 0; i < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	status, body, err := testutil.Do(f.client, req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return status, body
}

// versions sends n requests and counts the answers by version ("v1-a" ->
// "v1").
func (f *subsetFront) versions(t *testing.T, n int, path string, header ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for range n {
		status, body := f.get(t, path, header...)
		if status != 200 {
			t.Fatalf("GET %s %v: %d %q", path, header, status, body)
		}
		v, _, _ := strings.Cut(body, "-")
		out[v]++
	}
	return out
}

// A 95/5 split sends 5 % of the requests to v2, within 1.5 points over
// 3,000 requests (seeded draws), and the observer counts each subset's
// requests: the canary's share is measurable.
func TestProxySplitShares(t *testing.T) {
	f := newSubsetFront(t, Route{Prefix: "/split", Service: "orders", Hints: Hints{Subsets: Subsets{
		Split: []SplitShare{{Subset: "version=v1", Weight: 95}, {Subset: "version=v2", Weight: 5}},
	}}})
	const n = 3000
	got := f.versions(t, n, "/split/x")
	share := float64(got["v2"]) / n * 100
	t.Logf("v2 share %.2f %% of %d (%v)", share, n, got)
	if share < 3.5 || share > 6.5 {
		t.Fatalf("v2 share %.2f %%, want 5 ± 1.5", share)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen["orders/version=v2"] != got["v2"] || f.seen["orders/version=v1"] != got["v1"] {
		t.Fatalf("observer %v, answers %v", f.seen, got)
	}
}

// With a hash key, a split is sticky: a key always gets the same subset,
// and the shares hold over many keys (the hash is deterministic: no
// randomness in this test).
func TestProxySplitStickyByKey(t *testing.T) {
	f := newSubsetFront(t, Route{Prefix: "/split", Service: "orders", Hints: Hints{
		HashKey: HashKey{Header: "X-User"},
		Subsets: Subsets{Split: []SplitShare{{Subset: "version=v1", Weight: 80}, {Subset: "version=v2", Weight: 20}}},
	}})
	const users = 1000
	first := map[string]string{}
	onV2 := 0
	for round := range 2 {
		for i := range users {
			user := fmt.Sprintf("user-%d", i)
			_, body := f.get(t, "/split/cart", "X-User", user)
			v, _, _ := strings.Cut(body, "-")
			if prev, ok := first[user]; ok && prev != v {
				t.Fatalf("round %d: %s on %s, before on %s", round, user, v, prev)
			}
			if round == 0 && v == "v2" {
				onV2++
			}
			first[user] = v
		}
	}
	share := float64(onV2) / users * 100
	t.Logf("%d keys of %d on v2: %.1f %%", onV2, users, share)
	if share < 16 || share > 24 {
		t.Fatalf("%.1f %% of the keys on v2, want 20 ± 4", share)
	}
}

// The hint header (default X-Pushlb-Hint) selects the instances whose
// metadata hint equals it and falls back to every instance when none
// does; a route may rename it or turn it off, and on a route with a
// subset the hint falls back to that subset.
func TestProxyHintHeader(t *testing.T) {
	f := newSubsetFront(t,
		Route{Prefix: "/renamed", Service: "orders", Hints: Hints{HintHeader: "X-Canary"}},
		Route{Prefix: "/off", Service: "orders", Hints: Hints{HintHeader: "-"}},
		Route{Prefix: "/v1", Service: "orders", Hints: Hints{Subsets: Subsets{Subset: "version=v1", Fallback: "none"}}},
	)
	for _, tc := range []struct {
		path   string
		header []string
		want   map[string]int
	}{
		{"/orders/x", []string{"X-Pushlb-Hint", "canary"}, map[string]int{"v2": 30}},
		{"/orders/x", []string{"X-Pushlb-Hint", "nobody"}, map[string]int{"v1": 20, "v2": 10}},
		{"/orders/x", nil, map[string]int{"v1": 20, "v2": 10}},
		{"/renamed/x", []string{"X-Canary", "canary"}, map[string]int{"v2": 30}},
		{"/renamed/x", []string{"X-Pushlb-Hint", "canary"}, map[string]int{"v1": 20, "v2": 10}},
		{"/off/x", []string{"X-Pushlb-Hint", "canary"}, map[string]int{"v1": 20, "v2": 10}},
		{"/v1/x", []string{"X-Pushlb-Hint", "canary"}, map[string]int{"v2": 30}},
		{"/v1/x", []string{"X-Pushlb-Hint", "nobody"}, map[string]int{"v1": 30}},
	} {
		if got := f.versions(t, 30, tc.path, tc.header...); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s %v: %v, want %v", tc.path, tc.header, got, tc.want)
		}
	}
}

// Envoy's fallback policies when no instance matches: any instance, the
// default subset, or none: a 503 whose text names the selector.
func TestProxySubsetFallbacks(t *testing.T) {
	f := newSubsetFront(t,
		Route{Prefix: "/v2", Service: "orders", Hints: Hints{Subsets: Subsets{Subset: "version=v2", Fallback: "none"}}},
		Route{Prefix: "/any", Service: "orders", Hints: Hints{Subsets: Subsets{Subset: "version=v3"}}},
		Route{Prefix: "/default", Service: "orders", Hints: Hints{Subsets: Subsets{Subset: "version=v3", Fallback: "default", DefaultSubset: "version=v1"}}},
		Route{Prefix: "/none", Service: "orders", Hints: Hints{Subsets: Subsets{Subset: "version=v3", Fallback: "none"}}},
	)
	for _, tc := range []struct {
		path string
		want map[string]int
	}{
		{"/v2/x", map[string]int{"v2": 30}},
		{"/any/x", map[string]int{"v1": 20, "v2": 10}},
		{"/default/x", map[string]int{"v1": 30}},
	} {
		if got := f.versions(t, 30, tc.path); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %v, want %v", tc.path, got, tc.want)
		}
	}
	status, body := f.get(t, "/none/x")
	if status != http.StatusServiceUnavailable || strings.TrimSpace(body) != "orders: no instance matches version=v3" {
		t.Fatalf("fallback none: %d %q", status, body)
	}
}

func TestSubsetsValidate(t *testing.T) {
	for _, tc := range []struct {
		s    Subsets
		want string
	}{
		{Subsets{Subset: "version=v2"}, ""},
		{Subsets{Subset: "version=v2", Fallback: "default", DefaultSubset: "version=v1"}, ""},
		{Subsets{Split: []SplitShare{{"version=v1", 95}, {"version=v2", 5}}, Fallback: "none"}, ""},
		{Subsets{Subset: "version"}, `subset: selector "version": want key=value`},
		{Subsets{Subset: "version=v2", Split: []SplitShare{{"version=v1", 1}}}, "subset and split: set one of them"},
		{Subsets{Subset: "version=v2", Fallback: "nearest"}, `fallback: "nearest" is not one of any, default, none`},
		{Subsets{Subset: "version=v2", Fallback: "default"}, "defaultSubset: set it with fallback: default, and only then"},
		{Subsets{Subset: "version=v2", DefaultSubset: "version=v1"}, "defaultSubset: set it with fallback: default"},
		{Subsets{Subset: "version=v2", Fallback: "default", DefaultSubset: "v1"}, "defaultSubset: "},
		{Subsets{Fallback: "none"}, "fallback, defaultSubset: set with subset or split"},
		{Subsets{Split: []SplitShare{{"version=v1", 1}, {"version=", 1}}}, "split[1].subset: "},
		{Subsets{Split: []SplitShare{{"version=v1", 1}, {"version=v2", -1}}}, "split[1].weight: -1 out of range"},
		{Subsets{Split: []SplitShare{{"version=v1", 0}, {"version=v2", 0}}}, "split: every weight is 0"},
		{Subsets{Split: []SplitShare{{"version=v1", 1}, {" version = v1", 1}}}, "split[1].subset: version=v1 appears twice"},
	} {
		err := Hints{Subsets: tc.s}.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.s, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrInvalidOption saying %q", tc.s, err, tc.want)
		}
	}
	if err := (Hints{HintHeader: "X Hint"}).Validate(); err == nil || !strings.Contains(err.Error(), `hintHeader "X Hint"`) {
		t.Errorf("bad hint header: %v", err)
	}
	_, err := NewProxy(http.DefaultTransport, WithRoutes(Route{Prefix: "/x", Service: "x", Hints: Hints{Subsets: Subsets{Split: []SplitShare{{"version=v1", -5}}}}}))
	if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), `route "/x": split[0].weight`) {
		t.Errorf("a route with a bad split: %v", err)
	}
}

// A retry after a connection failure stays within the request's subset:
// with one of two v2 instances refusing connections, every request to the
// strict v2 route reaches the other, and v1 never sees one; when the only
// v2 instance left refuses, the request fails instead of leaving the
// subset.
func TestRetriesStayInTheSubset(t *testing.T) {
	v1 := newBackend(t, "v1-a", nil)
	v2 := newBackend(t, "v2-a", nil)
	list := []balancer.Server{v1.server(""), v2.server(""), refusing(t, "v2-dead")}
	list[0].Metadata = map[string]string{"version": "v1"}
	list[1].Metadata = map[string]string{"version": "v2"}
	list[2].Metadata = map[string]string{"version": "v2"}
	b := newBalancer(t, "orders", roundRobin(), list)
	tr := newTestTransport(t, BalancerMap{"orders": b})
	front, client := newFront(t, tr, WithRoutes(Route{Prefix: "/v2", Service: "orders", Hints: Hints{Subsets: Subsets{Subset: "version=v2", Fallback: "none"}}}))
	for range 20 {
		status, body, err := testutil.Do(client, newRequest(t, "GET", front.URL+"/v2/x", nil))
		if err != nil || status != 200 || body != "v2-a" {
			t.Fatalf("GET /v2/x: %d %q %v", status, body, err)
		}
	}
	if n := v1.hits.Load(); n != 0 {
		t.Fatalf("v1 got %d requests of the v2 route", n)
	}
	if err := b.SetServers([]balancer.Server{list[0], list[2]}); err != nil {
		t.Fatal(err)
	}
	status, body, err := testutil.Do(client, newRequest(t, "GET", front.URL+"/v2/x", nil))
	if err != nil || status != http.StatusBadGateway || v1.hits.Load() != 0 {
		t.Fatalf("only a refusing v2 left: %d %q %v, v1 hits %d", status, body, err, v1.hits.Load())
	}
}

// BenchmarkHintsContext measures what a route's hints cost a request that
// carries none, with the hint header read (the default) and off, and a
// request of a 95/5 split route: the subset's draw and its context value.
func BenchmarkHintsContext(b *testing.B) {
	req := httptest.NewRequest("GET", "/orders/x", nil)
	req.Header.Set("Accept", "*/*")
	req.Header.Set("User-Agent", "bench")
	split := Hints{Subsets: Subsets{Split: []SplitShare{{"version=v1", 95}, {"version=v2", 5}}}}
	for _, bc := range []struct {
		name string
		h    Hints
	}{
		{"hint-header-off", Hints{HintHeader: "-"}},
		{"hint-header-default", Hints{}},
		{"split", split},
	} {
		h := bc.h.over(Hints{})
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h.context(req, "orders")
			}
		})
	}
}
