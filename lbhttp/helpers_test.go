package lbhttp

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// inlineFlag runs every test's Transport with WithInlineHTTP1:
// go test ./lbhttp -args -lbhttp.inline
var inlineFlag = flag.Bool("lbhttp.inline", false, "build the tests' Transports with WithInlineHTTP1")

// seen is what a backend saw of one request.
type seen struct {
	Method, Path, RawPath, Query, Host string
	Header                             http.Header
	Body                               string
}

// backend is an httptest server on 127.0.0.1 that records what it saw.
type backend struct {
	*httptest.Server
	id   string
	hits atomic.Int64
	last atomic.Pointer[seen]
}

// newBackend starts a backend; h, when not nil, answers after the request
// is recorded, else the backend answers 200 with its ID.
func newBackend(t testing.TB, id string, h http.HandlerFunc) *backend {
	t.Helper()
	b := &backend{id: id}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.hits.Add(1)
		b.last.Store(&seen{
			Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, Query: r.URL.RawQuery,
			Host: r.Host, Header: r.Header.Clone(), Body: string(body),
		})
		if h != nil {
			h(w, r)
			return
		}
		io.WriteString(w, id)
	}))
	t.Cleanup(b.Close)
	return b
}

// server returns the balancer entry of the backend.
func (b *backend) server(zone string) balancer.Server {
	return serverAt(b.id, b.Listener.Addr().String(), zone)
}

func serverAt(id, addr, zone string) balancer.Server {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		panic(err)
	}
	p, _ := strconv.Atoi(port)
	return balancer.Server{ID: id, Host: host, Port: p, Zone: zone}
}

// refusing returns a server whose address refuses connections: a free
// port from the tests' reserved range (testutil.FreePort), which no other
// test binds; a port closed after a port-0 bind is the kernel's to hand
// out again, to the next test's server.
func refusing(t testing.TB, id string) balancer.Server {
	t.Helper()
	return serverAt(id, testutil.FreeAddr(t), "")
}

// newBalancer builds a balancer holding servers, closed at cleanup.
func newBalancer(t testing.TB, name string, cfg balancer.Config, servers []balancer.Server, opts ...balancer.Option) *balancer.Balancer {
	t.Helper()
	b, err := balancer.New(name, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if len(servers) > 0 {
		if err := b.SetServers(servers); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// newTestTransport builds a Transport whose idle connections are closed at
// cleanup (before the backends, which were registered earlier).
func newTestTransport(t testing.TB, bs balancer.Balancers, opts ...Option) *Transport {
	t.Helper()
	if *inlineFlag {
		opts = append(opts, WithInlineHTTP1())
	}
	tr, err := NewTransport(bs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// scriptRule picks the servers with the given IDs in turn, then repeats
// the last one; it makes the order of servers in a test certain.
type scriptRule struct {
	mu  sync.Mutex
	ids []string
	n   int
}

func script(ids ...string) *scriptRule { return &scriptRule{ids: ids} }

func (r *scriptRule) Choose(p balancer.PickInfo) (*balancer.Server, error) {
	r.mu.Lock()
	id := r.ids[min(r.n, len(r.ids)-1)]
	r.n++
	r.mu.Unlock()
	for _, s := range p.Candidates.Servers() {
		if s.ID == id {
			return s, nil
		}
	}
	return nil, nil
}

// counts is an Observer that counts what it is told.
type counts struct {
	picks, retries, results, connectFailures atomic.Int64
}

func (c *counts) observer() Observer {
	return Observer{
		OnPick:  func(string, *balancer.Server) { c.picks.Add(1) },
		OnRetry: func(string, error) { c.retries.Add(1) },
		OnResult: func(r Result) {
			c.results.Add(1)
			if r.ConnectFailure {
				c.connectFailures.Add(1)
			}
		},
	}
}

// newRequest builds a request with a test deadline.
func newRequest(t testing.TB, method, url string, body io.Reader) *http.Request {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// roundRobin is the default config with the RoundRobin rule.
func roundRobin() balancer.Config {
	cfg := balancer.DefaultConfig()
	cfg.Rule = balancer.RuleRoundRobin
	return cfg
}
