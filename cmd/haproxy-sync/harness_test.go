package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// haproxy is a real HAProxy process started by a test, with its stats
// socket (and, in master-worker mode, its master CLI) in a directory of
// its own, stopped by the test's cleanup.
type haproxy struct {
	dir, cfg    string
	sock        string // the stats socket, level admin
	masterSock  string // the master CLI, "" unless master-worker
	port        int    // the frontend's
	api         *runtimeAPI
	mu          sync.Mutex
	proc        *testutil.Proc
	masterWorks bool
}

// haproxyConfig is what a test's HAProxy runs: backends (haproxy.cfg
// text), and the frontend's default backend.
type haproxyConfig struct {
	backends     string
	frontend     string // the default backend
	masterWorker bool
	global       string // more lines of the global section
}

// startHAProxy starts HAProxy with c and waits until its runtime API
// answers.
func startHAProxy(t testing.TB, c haproxyConfig) *haproxy {
	t.Helper()
	bin := testutil.Tool(t, "haproxy", "haproxy")
	// A unix socket's path is limited to ~100 bytes: t.TempDir's may be
	// longer.
	dir, err := os.MkdirTemp("", "hx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &haproxy{dir: dir, cfg: filepath.Join(dir, "haproxy.cfg"), sock: filepath.Join(dir, "admin.sock"), port: testutil.FreePort(t)}
	global := "global\n  stats socket " + h.sock + " mode 600 level admin expose-fd listeners\n"
	global += c.global
	if c.masterWorker {
		h.masterSock = filepath.Join(dir, "master.sock")
		global += "  master-worker\n"
	}
	cfg := global + fmt.Sprintf(`defaults
  mode http
  timeout connect 1s
  timeout client 10s
  timeout server 10s
  retries 3
  option redispatch 1
  retry-on conn-failure empty-response
frontend fe
  bind 127.0.0.1:%d
  default_backend %s
%s`, h.port, c.frontend, c.backends)
	if err := os.WriteFile(h.cfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h.api = &runtimeAPI{network: "unix", addr: h.sock, timeout: 2 * time.Second}
	h.start(t, bin)
	return h
}

// start runs HAProxy in the foreground and waits for its socket.
func (h *haproxy) start(t testing.TB, bin string) {
	t.Helper()
	args := []string{"-db", "-f", h.cfg}
	if h.masterSock != "" {
		args = append([]string{"-W", "-S", h.masterSock}, args...)
	}
	p := testutil.Start(t, bin, args...)
	h.mu.Lock()
	h.proc = p
	h.mu.Unlock()
	testutil.Eventually(t, "HAProxy's runtime API answers", func() bool {
		_, err := h.api.processInfo(context.Background())
		return err == nil
	})
	if h.masterSock != "" {
		// The worker answers before the master runs its loop, where it
		// takes SIGUSR2 and serves its CLI: a reload signalled earlier is
		// lost.
		master := &runtimeAPI{network: "unix", addr: h.masterSock, timeout: 2 * time.Second}
		testutil.Eventually(t, "HAProxy's master CLI answers", func() bool {
			reply, err := master.do(context.Background(), "show proc;quit")
			return err == nil && strings.Contains(reply, "worker")
		})
	}
}

// restart stops HAProxy (SIGKILL: nothing of its state survives) and
// starts it again with the same configuration and socket.
func (h *haproxy) restart(t testing.TB) {
	t.Helper()
	h.mu.Lock()
	p := h.proc
	h.mu.Unlock()
	p.Kill(t)
	p.Wait(t, 10*time.Second)
	h.start(t, testutil.Tool(t, "haproxy", "haproxy"))
}

// reload asks the master of a master-worker HAProxy to reload (SIGUSR2)
// and waits until a new worker answers on the socket.
func (h *haproxy) reload(t testing.TB) {
	t.Helper()
	before := h.info(t).PID
	h.mu.Lock()
	p := h.proc
	h.mu.Unlock()
	p.Signal(t, syscall.SIGUSR2)
	testutil.Eventually(t, "a new HAProxy worker answers", func() bool {
		info, err := h.api.processInfo(context.Background())
		return err == nil && info.PID != before
	})
}

func (h *haproxy) info(t testing.TB) processInfo {
	t.Helper()
	info, err := h.api.processInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// servers reads a backend's servers, failing the test on an error.
func (h *haproxy) servers(t testing.TB, backend string) map[string]*haServer {
	t.Helper()
	s, err := h.api.backendServers(context.Background(), backend)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitServers polls the backend's state, as HAProxy reports it, until cond
// holds.
func (h *haproxy) waitServers(t testing.TB, backend, what string, cond func(map[string]*haServer) bool) {
	t.Helper()
	var last map[string]*haServer
	testutil.Eventually(t, what, func() bool {
		s, err := h.api.backendServers(context.Background(), backend)
		if err != nil {
			return false
		}
		last = s
		return cond(s)
	})
	_ = last
}

// do runs a command on the runtime API, failing the test on an error.
func (h *haproxy) exec(t testing.TB, cmd string, ok ...string) {
	t.Helper()
	if err := h.api.exec(context.Background(), cmd, ok...); err != nil {
		t.Fatal(err)
	}
}

// url is the frontend's URL of path.
func (h *haproxy) url(path string) string { return "http://127.0.0.1:" + strconv.Itoa(h.port) + path }

// ours returns the names of the servers the sync added (the default
// prefix), with their state.
func ours(s map[string]*haServer) map[string]*haServer {
	out := map[string]*haServer{}
	for name, srv := range s {
		if strings.HasPrefix(name, defaultNamePrefix) {
			out[name] = srv
		}
	}
	return out
}

// syncRun is an in-process run of the program (run), with its log.
type syncRun struct {
	cancel context.CancelFunc
	done   chan int
	log    *testutil.SyncBuffer
}

// startSync runs haproxy-sync with args until the test ends.
func startSync(t testing.TB, args ...string) *syncRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &syncRun{cancel: cancel, done: make(chan int, 1), log: &testutil.SyncBuffer{}}
	go func() { r.done <- run(ctx, append([]string{"-log-level", "debug"}, args...), io.Discard, r.log) }()
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("haproxy-sync's log:\n%s", r.log.String())
		}
	})
	return r
}

// stop ends the run and returns its exit status (once; later calls return
// the same).
func (r *syncRun) stop(t testing.TB) int {
	t.Helper()
	r.cancel()
	select {
	case code := <-r.done:
		r.done <- code
		return code
	case <-time.After(20 * time.Second):
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2)
		t.Fatalf("haproxy-sync did not stop within 20 s; goroutines:\n%s", stacks.String())
		return -1
	}
}

// waitLog waits for a line of the log holding every one of parts.
func (r *syncRun) waitLog(t testing.TB, parts ...string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("a log line with %q", parts), func() bool {
		for _, line := range strings.Split(r.log.String(), "\n") {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(line, p)
			}
			if all {
				return true
			}
		}
		return false
	})
}

// backend is an instance of a service: an HTTP server that counts its
// requests, announced over a NATS connection of its own (so that closing
// both is its crash).
type backend struct {
	id    string
	srv   *httptest.Server
	nc    *nats.Conn
	pub   *publisher.Publisher
	hits  atomic.Int64
	last  atomic.Int64  // when it last received a request, UnixNano
	block chan struct{} // when set, requests to /slow wait for its close
}

// announce starts a backend and announces it as an instance of service.
func announce(t testing.TB, ns *natstest.Server, service, id, zone string, weight int) *backend {
	t.Helper()
	b := &backend{id: id, block: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.hits.Add(1)
		b.last.Store(time.Now().UnixNano())
		if r.URL.Path == "/slow" {
			select {
			case <-b.block:
			case <-r.Context().Done():
			}
		}
		fmt.Fprintf(w, "%s %s", id, r.URL.Path)
	}))
	t.Cleanup(b.srv.Close)
	b.nc = ns.Connect(t, nats.MaxReconnects(-1))
	b.pub = testpub.AnnounceAt(t, b.nc, b.srv.Listener.Addr().String(),
		serverlist.Instance{Service: service, InstanceID: id, Zone: zone, Weight: weight, Incarnation: time.Now().UnixNano()})
	return b
}

// withdraw announces the backend offline (its graceful stop).
func (b *backend) withdraw(t testing.TB) {
	t.Helper()
	if err := b.pub.Withdraw(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
}

// crash closes the backend's listener and its NATS connection at once,
// as a process killed with SIGKILL would.
func (b *backend) crash() {
	b.srv.Listener.Close()
	b.srv.CloseClientConnections()
	b.nc.Close()
}

func (b *backend) addr() (string, int) {
	host, port, _ := net.SplitHostPort(b.srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return host, p
}

// get sends one request through HAProxy and returns its status and body.
func get(client *http.Client, url string) (int, string, error) {
	return testutil.Fetch(client, url)
}

func zerologNop() zerolog.Logger { return zerolog.Nop() }

// counter sums the series of the metric name whose label has value.
func counter(m *metrics, name, label, value string) float64 {
	families, _ := m.reg.Gather()
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += s.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
