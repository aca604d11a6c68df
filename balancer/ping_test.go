package balancer

import (
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func serverOf(t *testing.T, id string, ts *httptest.Server) Server {
	t.Helper()
	host, port, err := net.SplitHostPort(ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return Server{ID: id, Host: host, Port: p}
}

func TestHTTPPingMarksServersDownAndUp(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" || !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer flaky.Close()
	steady := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer steady.Close()

	cfg := DefaultConfig()
	cfg.Ping = PingConfig{Kind: PingHTTP, Path: "health", Interval: 10 * time.Millisecond, Timeout: time.Second}
	b, err := New("svc", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.SetServers([]Server{serverOf(t, "flaky", flaky), serverOf(t, "steady", steady)})
	reachable := func() []string { return ids(b.ReachableServers()) }

	healthy.Store(false)
	testutil.Eventually(t, "flaky to be pinged down", func() bool { return slices.Equal(reachable(), []string{"steady"}) })
	healthy.Store(true)
	testutil.Eventually(t, "flaky to be pinged up", func() bool { return len(reachable()) == 2 })

	steady.Close() // refuses connections from now on
	testutil.Eventually(t, "a closed server to be pinged down", func() bool { return slices.Equal(reachable(), []string{"flaky"}) })
}

func TestNoOpPingRunsNoLoop(t *testing.T) {
	b, err := New("svc", DefaultConfig(), WithPinger(NoOpPing{}))
	if err != nil {
		t.Fatal(err)
	}
	b.Start(t.Context())
	defer b.Close()
	if b.pingLoop != nil {
		t.Fatal("a no-op ping must not start a loop")
	}
}
