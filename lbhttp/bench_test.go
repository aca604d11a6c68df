package lbhttp

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// okServer is a backend that answers "ok" and records nothing, so that the
// benchmarks measure the client side.
func okServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	b.Cleanup(srv.Close)
	return srv
}

// roundTripLoop sends req through rt b.N times, reading every body.
func roundTripLoop(b *testing.B, rt http.RoundTripper, req *http.Request) {
	b.ReportAllocs()
	for b.Loop() {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkRoundTrip compares one GET through a plain *http.Transport with
// the same GET through lbhttp's Transport over a balancer of that backend:
// the difference is the cost of the pick, the URL rewrite and the stats.
func BenchmarkRoundTrip(b *testing.B) {
	srv := okServer(b)
	b.Run("plain", func(b *testing.B) {
		rt := &http.Transport{MaxIdleConnsPerHost: defaultMaxIdleConnsPerHost}
		defer rt.CloseIdleConnections()
		req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
		roundTripLoop(b, rt, req)
	})
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"lbhttp", nil},
		{"lbhttp-inline", []Option{WithInlineHTTP1()}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			lb := newBalancer(b, "bench", balancer.DefaultConfig(), []balancer.Server{serverAt("a", srv.Listener.Addr().String(), "")})
			tr := newTestTransport(b, BalancerMap{"bench": lb}, tc.opts...)
			req, _ := http.NewRequest("GET", "http://bench/x", nil)
			roundTripLoop(b, tr, req)
		})
	}
}

// BenchmarkProxy measures GETs straight to a backend ("direct") and
// through the Proxy ("proxy"; "proxy-inline" with WithInlineHTTP1): from concurrent clients (GOMAXPROCS of them)
// for throughput, and from one client ("-serial") for unloaded latency.
// Besides ns/op (wall time per request) it reports requests per second
// and the 99th percentile of the per-request latency.
func BenchmarkProxy(b *testing.B) {
	srv := okServer(b)
	front := func(opts ...Option) string {
		lb := newBalancer(b, "bench", balancer.DefaultConfig(), []balancer.Server{serverAt("a", srv.Listener.Addr().String(), "")})
		tr := newTestTransport(b, BalancerMap{"bench": lb}, opts...)
		p, err := NewProxy(tr)
		if err != nil {
			b.Fatal(err)
		}
		s := httptest.NewServer(p)
		b.Cleanup(s.Close)
		return s.URL + "/bench/x"
	}
	proxy, inline := front(), front(WithInlineHTTP1())

	for _, tc := range []struct {
		name, url string
		parallel  bool
	}{
		{"direct", srv.URL + "/x", true},
		{"proxy", proxy, true},
		{"proxy-inline", inline, true},
		{"direct-serial", srv.URL + "/x", false},
		{"proxy-serial", proxy, false},
		{"proxy-inline-serial", inline, false},
	} {
		b.Run(tc.name, func(b *testing.B) { benchmarkGets(b, tc.url, tc.parallel) })
	}
}

// benchmarkGets sends GETs to url and reports throughput and latency
// percentiles.
func benchmarkGets(b *testing.B, url string, parallel bool) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: defaultMaxIdleConnsPerHost}}
	defer client.CloseIdleConnections()
	testutil.GetLoad(b, client, url, parallel)
}
