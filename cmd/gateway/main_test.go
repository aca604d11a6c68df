package main

// These tests build and run the real binaries: gateway (with its embedded
// NATS server), announce, and internal/testkit/testbackend.

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

var bin struct{ gateway, announce, backend, service, natsServer string }

// TestMain builds the binaries; once the tests passed, the processes were
// killed and reaped, and the test's own HTTP clients and servers must be
// gone too (client shares http.DefaultClient's transport).
func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(paths []string) {
		bin.gateway, bin.announce, bin.backend, bin.service, bin.natsServer = paths[0], paths[1], paths[2], paths[3], paths[4]
	}, ".", "../announce", "../../internal/testkit/testbackend", "../../examples/embed/service", natsproc.Module))
}

// Bounds of the waits for a process: one line of output, an exit.
const (
	lineTimeout = 10 * time.Second
	exitTimeout = 15 * time.Second
)

// start runs a binary; the test's cleanup kills it.
func start(t testing.TB, path string, args ...string) *testutil.Proc {
	t.Helper()
	return testutil.Start(t, path, args...)
}

// gw is a gateway process. The start helpers run it with -follow all:
// the tests read whole-fleet state on the admin API (/-/lb, /metrics)
// before any request, which a gateway following on request (the default)
// shows only for the services asked for. TestDefaultFollowsOnRequest runs
// the default.
type gw struct {
	*testutil.Proc
	proxy, admin, nats string
}

func startGateway(t testing.TB, dataDir, natsAddr string) *gw {
	t.Helper()
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: natsAddr}
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", natsAddr, "-data-dir", dataDir, "-log-level", "debug", "-follow", "all")
	g.waitHealthy(t)
	return g
}

// waitHealthy waits until the gateway's /healthz answers 200.
func (g *gw) waitHealthy(t testing.TB) {
	t.Helper()
	testutil.Eventually(t, "the gateway to be healthy", func() bool {
		code, _, err := testutil.Fetch(client, "http://"+g.admin+"/healthz")
		return err == nil && code == 200
	})
}

// client bounds each request of the tests to the gateway at 5 s. Its
// transport is http.DefaultTransport.
var client = &http.Client{Timeout: 5 * time.Second}

// hit sends one request through the gateway and returns the status and the
// body without surrounding space.
func (g *gw) hit(path string) (int, string, error) {
	code, body, err := testutil.Fetch(client, "http://"+g.proxy+path)
	return code, strings.TrimSpace(body), err
}

// state returns the admin's /-/lb JSON, "" when it cannot be read.
func (g *gw) state(t testing.TB) string {
	_, body, err := testutil.Fetch(client, "http://"+g.admin+"/-/lb")
	if err != nil {
		return ""
	}
	return body
}

// named is an in-process backend that answers with its name.
func named(t testing.TB, name string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) }))
	t.Cleanup(s.Close)
	return s
}

// metric returns the value of one series of the gateway's /metrics, such
// as `pushlb_gossip_members` or `pushlb_servers{service="orders"}`: 0 when
// the series is absent, NaN (unequal to everything) when /metrics cannot
// be read.
func (g *gw) metric(series string) float64 {
	return testutil.Metric(client, "http://"+g.admin+"/metrics", series)
}

func announceHold(t testing.TB, g *gw, service, addr string, extra ...string) *testutil.Proc {
	args := append([]string{"-nats", "nats://" + g.nats, "-service", service, "-addr", addr, "-drain", "0s"}, extra...)
	return start(t, bin.announce, args...)
}

// startConfigured starts the gateway binary with the YAML configuration
// yaml, an embedded NATS server and a data directory of its own, and
// waits for it to say it started.
func startConfigured(t testing.TB, yaml string) *gw {
	t.Helper()
	cfgFile := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(cfgFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-config", cfgFile, "-listen", g.proxy, "-admin", g.admin,
		"-embedded-nats", g.nats, "-data-dir", t.TempDir(), "-follow", "all")
	g.WaitFor(t, "gateway started", lineTimeout)
	return g
}

// seenBy sends n requests and returns the bodies of the successful ones,
// for waiting until something holds.
func (g *gw) seenBy(path string, n int) map[string]int {
	seen := map[string]int{}
	for range n {
		if code, body, err := g.hit(path); err == nil && code == 200 {
			seen[body]++
		}
	}
	return seen
}

// reached sends n requests, fails the test on any failure, and returns the
// bodies seen.
func (g *gw) reached(t testing.TB, path string, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range n {
		code, body, err := g.hit(path)
		if err != nil || code != 200 {
			t.Fatalf("request failed: %d %q %v", code, body, err)
		}
		seen[body]++
	}
	return seen
}

func TestGatewayWithAnnouncedBackends(t *testing.T) {
	g := startGateway(t, t.TempDir(), testutil.FreeAddr(t))
	backends := []*httptest.Server{named(t, "b1"), named(t, "b2"), named(t, "b3")}
	var anns []*testutil.Proc
	for _, b := range backends {
		anns = append(anns, announceHold(t, g, "orders", b.Listener.Addr().String()))
	}
	testutil.Eventually(t, "all three backends through the gateway", func() bool {
		return len(g.seenBy("/orders/x", 12)) == 3
	})

	// SIGTERM the second announce: once the gateway has its offline, no
	// request reaches b2, which keeps running.
	anns[1].Stop(t, exitTimeout)
	testutil.Eventually(t, "the gateway to drop b2", func() bool { return strings.Count(g.state(t), `"id"`) == 2 })
	if seen := g.reached(t, "/orders/x", 60); seen["b2"] != 0 || len(seen) != 2 {
		t.Fatalf("after b2's offline: %v", seen)
	}
	if code, body := testutil.Get(t, backends[1].URL); code != 200 || body != "b2" {
		t.Fatalf("b2 should still run: %d %q", code, body)
	}
}

func TestGatewayRetriesPastARefusingBackend(t *testing.T) {
	g := startGateway(t, t.TempDir(), testutil.FreeAddr(t))
	good := named(t, "good")
	bad := named(t, "bad")
	announceHold(t, g, "orders", good.Listener.Addr().String())
	announceHold(t, g, "orders", bad.Listener.Addr().String())
	testutil.Eventually(t, "both backends", func() bool { return len(g.seenBy("/orders/", 10)) == 2 })
	bad.Close() // refuses connections; still registered and listed
	if seen := g.reached(t, "/orders/", 50); seen["good"] != 50 {
		t.Fatalf("want every request answered by good, got %v", seen)
	}
}

func TestGatewayRestartServesAtOnce(t *testing.T) {
	dataDir, natsAddr := t.TempDir(), testutil.FreeAddr(t)
	g := startGateway(t, dataDir, natsAddr)
	for _, name := range []string{"r1", "r2", "r3"} {
		announceHold(t, g, "orders", named(t, name).Listener.Addr().String())
	}
	testutil.Eventually(t, "three backends", func() bool { return len(g.seenBy("/orders/", 12)) == 3 })
	g.Stop(t, exitTimeout)

	began := time.Now()
	g2 := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: natsAddr}
	g2.Proc = start(t, bin.gateway, "-listen", g2.proxy, "-admin", g2.admin, "-embedded-nats", natsAddr, "-data-dir", dataDir)
	seen := map[string]bool{}
	defer func() {
		if t.Failed() {
			t.Logf("the restarted gateway reached only %v", seen)
		}
	}()
	testutil.EventuallyWithin(t, 10*time.Second, "the restarted gateway to reach all 3 instances", func() bool {
		for len(seen) < 3 {
			code, body, err := g2.hit("/orders/")
			if err != nil || code != 200 {
				return false // not serving yet: poll again
			}
			seen[body] = true
		}
		return true
	})
	// The figure (under 1 s on an idle machine) is logged, not asserted:
	// the 10 s bound above already tells the registry's state, read at
	// start, from the 30 s lease.
	t.Logf("restarted gateway served all 3 instances %v after its process started", time.Since(began))
}

// TestRollingRestartZeroFailures: three backends under `announce --`; a
// client sends a steady stream through the gateway while each backend in
// turn gets SIGTERM and is started again. No request may fail.
func TestRollingRestartZeroFailures(t *testing.T) {
	g := startGateway(t, t.TempDir(), testutil.FreeAddr(t))
	addrs := []string{testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)}
	supervise := func(i int) *testutil.Proc {
		return start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", addrs[i], "-drain", "300ms",
			"--", bin.backend, "-addr", addrs[i], "-name", fmt.Sprintf("v%d", i))
	}
	procs := []*testutil.Proc{supervise(0), supervise(1), supervise(2)}
	testutil.Eventually(t, "three backends", func() bool { return len(g.seenBy("/orders/", 12)) == 3 })

	l := startLoad(g, loadWorkers)
	for i := range procs {
		if code := procs[i].Stop(t, exitTimeout); code != 0 {
			t.Errorf("announce %d exited %d", i, code)
		}
		restarted := time.Now()
		procs[i] = supervise(i)
		// The load's own answers tell (requests of the test's beside the
		// load would exceed the retries the budget always allows).
		l.waitAnswered(t, fmt.Sprintf("v%d", i), restarted)
	}
	l.stop()
	sent, failed := l.counts()
	t.Logf("rolling restart: %d requests, %d failed", sent, failed)
	if failed != 0 {
		t.Fatalf("%d of %d requests failed during the rolling restart; first: %v", failed, sent, l.first())
	}
}

func TestBadConfigExitsTwo(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listn: oops\n"), 0o600)
	for _, args := range [][]string{{"-config", bad}, {"-log-level", "loud"}, {"stray"}, {"-gossip", "127.0.0.1:1", "-gossip-key", "short"}} {
		p := start(t, bin.gateway, args...)
		if code := p.Wait(t, exitTimeout); code != 2 {
			t.Errorf("gateway %v exited %d, want 2: %s", args, code, p.Output())
		}
	}
	p := start(t, bin.gateway, "-config", bad)
	p.Wait(t, exitTimeout)
	if out := p.Output(); !strings.Contains(out, "listn") {
		t.Errorf("the error should name the bad key: %s", out)
	}
	// This build has no xDS server: -xds, and its help, say where the one
	// that has is, and its guide.
	p = start(t, bin.gateway, "-xds", "127.0.0.1:0")
	if code := p.Wait(t, exitTimeout); code != 2 || !strings.Contains(p.Output(), "xds/cmd/gateway") || !strings.Contains(p.Output(), "docs/xds.md") {
		t.Errorf("gateway -xds exited %d, want 2 naming the xds build and docs/xds.md: %s", code, p.Output())
	}
	p = start(t, bin.gateway, "-h")
	if code := p.Wait(t, exitTimeout); code != 0 || !regexp.MustCompile(`-xds address\n.*docs/xds\.md`).MatchString(p.Output()) {
		t.Errorf("gateway -h exited %d, want 0 with -xds pointing to docs/xds.md: %s", code, p.Output())
	}
	// A mistyped flag or a stray argument: the mistake and where the help
	// is, not the 60 lines of help.
	for _, args := range [][]string{{"-listn", ":1"}, {"stray"}} {
		p = start(t, bin.gateway, args...)
		code := p.Wait(t, exitTimeout)
		out := p.Output()
		if code != 2 || strings.Count(out, "\n") != 2 || !strings.Contains(out, `"gateway -h"`) || !strings.Contains(out, args[0][1:]) {
			t.Errorf("gateway %v exited %d, want 2 with the mistake and a line pointing to -h:\n%s", args, code, out)
		}
	}
}

// A configuration file's mistakes come in one pass, typos and values out
// of range alike, each with its file and line, after one prefix.
func TestBadConfigSaysEveryMistake(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("lease: -5s\nlistn: oops\nnats: {connectTimeout: -1s}\n"), 0o600)
	p := start(t, bin.gateway, "-config", bad)
	code := p.Wait(t, exitTimeout)
	want := "gateway: invalid config: " + bad + ":1: lease: -5s is below the minimum 1s (0: the bucket's)\n" +
		bad + `:2: listn: unknown key (did you mean "listen"?)` + "\n" +
		bad + ":3: nats.connectTimeout: -1s is negative\n"
	if code != 2 || p.Stderr() != want {
		t.Errorf("exit %d, stderr\n%s\nwant\n%s", code, p.Stderr(), want)
	}
}

// The gateway's log lines have milliseconds, as announce's: a crash and
// the removal it causes are milliseconds apart.
func TestLogTimesHaveMilliseconds(t *testing.T) {
	// A start that fails after the logger is made: its first line logs
	// the memory limit.
	p := start(t, bin.gateway, "-gossip", "127.0.0.1:1", "-gossip-key", "short")
	p.Wait(t, exitTimeout)
	line := p.WaitFor(t, `"message":"memory limit"`, lineTimeout)
	if !regexp.MustCompile(`"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}`).MatchString(line.Text) {
		t.Errorf("log line without milliseconds: %s", line.Text)
	}
}

// BenchmarkGatewayVsDirect measures, in the same run, requests sent straight
// to a backend and through the real gateway binary (embedded NATS, the
// backend announced by a real announce process): throughput with 8
// concurrent clients and per-request latency percentiles.
func BenchmarkGatewayVsDirect(b *testing.B) {
	g := startGateway(b, b.TempDir(), testutil.FreeAddr(b))
	be := named(b, "bench")
	announceHold(b, g, "bench", be.Listener.Addr().String())
	testutil.Eventually(b, "the backend through the gateway", func() bool { return g.seenBy("/bench/", 1)["bench"] == 1 })
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for _, target := range []struct{ name, url string }{{"direct", be.URL + "/"}, {"gateway", "http://" + g.proxy + "/bench/"}} {
		b.Run(target.name, func(b *testing.B) {
			b.SetParallelism(4) // 8 clients on 2 cores
			testutil.GetLoad(b, c, target.url, true)
		})
	}
}

// TestSIGTERMFinishesInFlightRequests: on SIGTERM the gateway stops
// accepting, lets a slow request in flight finish, and exits 0.
func TestSIGTERMFinishesInFlightRequests(t *testing.T) {
	g := startGateway(t, t.TempDir(), testutil.FreeAddr(t))
	// The backend holds the test's request (marked by its query, so that
	// nothing else is held) until released, and says when it has it.
	arrived, release := make(chan struct{}), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery == "inflight" {
			close(arrived)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "slow")
	}))
	t.Cleanup(slow.Close)
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // runs first: slow.Close waits for the handler
	announceHold(t, g, "slow", slow.Listener.Addr().String())
	testutil.Eventually(t, "the backend listed", func() bool { return strings.Count(g.state(t), `"id"`) == 1 })
	type result struct {
		code int
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, body, err := g.hit("/slow/?inflight")
		done <- result{code, body, err}
	}()
	testutil.Receive(t, arrived, lineTimeout, "the request to reach the backend") // in flight now
	g.Signal(t, syscall.SIGTERM)
	// Release the request only once the gateway is shutting down: it has
	// closed its proxy listener, so connecting is refused.
	testutil.Eventually(t, "the gateway to stop accepting", func() bool {
		c, err := net.DialTimeout("tcp", g.proxy, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	releaseOnce()
	r := testutil.Receive(t, done, lineTimeout, "the in-flight request's response")
	if r.err != nil || r.code != 200 || r.body != "slow" {
		t.Fatalf("in-flight request: %d %q %v", r.code, r.body, r.err)
	}
	if code := g.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	if _, _, err := g.hit("/slow/"); err == nil {
		t.Fatal("the gateway still accepts requests after exiting")
	}
}
