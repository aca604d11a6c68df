package main

// These tests build and run the real binaries: gateway (with its embedded
// NATS server), announce, and internal/testbackend.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testutil"
)

var bin struct{ gateway, announce, backend string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pushlb-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin.gateway, bin.announce, bin.backend = filepath.Join(dir, "gateway"), filepath.Join(dir, "announce"), filepath.Join(dir, "testbackend")
	for out, pkg := range map[string]string{bin.gateway: ".", bin.announce: "../announce", bin.backend: "../../internal/testbackend"} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, b)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// proc is a running binary whose output is kept for failure reports.
type proc struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
	err  error
}

func start(t testing.TB, path string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(path, args...), out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("%s %v output:\n%s", filepath.Base(path), args, p.out)
		}
	})
	return p
}

// stop sends SIGTERM and waits for the exit.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not exit after SIGTERM", p.cmd.Path)
	}
}

type gw struct {
	*proc
	proxy, admin, nats string
}

func startGateway(t testing.TB, dataDir, natsAddr string) *gw {
	t.Helper()
	g := &gw{proxy: freePort(t), admin: freePort(t), nats: natsAddr}
	g.proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", natsAddr, "-data-dir", dataDir, "-log-level", "debug")
	testutil.Eventually(t, "the gateway to be healthy", func() bool {
		resp, err := http.Get("http://" + g.admin + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return g
}

var client = &http.Client{Timeout: 5 * time.Second}

// hit sends one request through the gateway and returns the status and body.
func (g *gw) hit(path string) (int, string, error) {
	resp, err := client.Get("http://" + g.proxy + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// state returns the admin's /-/lb JSON.
func (g *gw) state(t testing.TB) string {
	resp, err := client.Get("http://" + g.admin + "/-/lb")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// named is an in-process backend that answers with its name.
func named(t testing.TB, name string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) }))
	t.Cleanup(s.Close)
	return s
}

func announceHold(t testing.TB, g *gw, service, addr string) *proc {
	return start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", service, "-addr", addr, "-drain", "0s")
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
	g := startGateway(t, t.TempDir(), freePort(t))
	backends := []*httptest.Server{named(t, "b1"), named(t, "b2"), named(t, "b3")}
	var anns []*proc
	for _, b := range backends {
		anns = append(anns, announceHold(t, g, "orders", b.Listener.Addr().String()))
	}
	testutil.Eventually(t, "all three backends through the gateway", func() bool {
		return len(g.seenBy("/orders/x", 12)) == 3
	})

	// SIGTERM the second announce: once the gateway has its offline, no
	// request reaches b2, which keeps running.
	anns[1].stop(t)
	testutil.Eventually(t, "the gateway to drop b2", func() bool { return strings.Count(g.state(t), `"id"`) == 2 })
	if seen := g.reached(t, "/orders/x", 60); seen["b2"] != 0 || len(seen) != 2 {
		t.Fatalf("after b2's offline: %v", seen)
	}
	if resp, err := http.Get(backends[1].URL); err != nil || resp.StatusCode != 200 {
		t.Fatalf("b2 should still run: %v", err)
	}
}

func TestGatewayRetriesPastARefusingBackend(t *testing.T) {
	g := startGateway(t, t.TempDir(), freePort(t))
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

func TestGatewayRestartServesWithinOneSecond(t *testing.T) {
	dataDir, natsAddr := t.TempDir(), freePort(t)
	g := startGateway(t, dataDir, natsAddr)
	for _, name := range []string{"r1", "r2", "r3"} {
		announceHold(t, g, "orders", named(t, name).Listener.Addr().String())
	}
	testutil.Eventually(t, "three backends", func() bool { return len(g.seenBy("/orders/", 12)) == 3 })
	g.stop(t)

	began := time.Now()
	g2 := &gw{proxy: freePort(t), admin: freePort(t), nats: natsAddr}
	g2.proc = start(t, bin.gateway, "-listen", g2.proxy, "-admin", g2.admin, "-embedded-nats", natsAddr, "-data-dir", dataDir)
	seen := map[string]bool{}
	for len(seen) < 3 {
		if time.Since(began) > 10*time.Second {
			t.Fatalf("the restarted gateway reached only %v", seen)
		}
		if code, body, err := g2.hit("/orders/"); err == nil && code == 200 {
			seen[body] = true
		} else {
			time.Sleep(2 * time.Millisecond)
		}
	}
	elapsed := time.Since(began)
	t.Logf("restarted gateway served all 3 instances %v after its process started", elapsed)
	if elapsed > time.Second {
		t.Errorf("took %v, want under 1 s", elapsed)
	}
}

// TestRollingRestartZeroFailures: three backends under `announce --`; a
// client sends a steady stream through the gateway while each backend in
// turn gets SIGTERM and is started again. No request may fail.
func TestRollingRestartZeroFailures(t *testing.T) {
	g := startGateway(t, t.TempDir(), freePort(t))
	addrs := []string{freePort(t), freePort(t), freePort(t)}
	supervise := func(i int) *proc {
		return start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", addrs[i], "-drain", "300ms",
			"--", bin.backend, "-addr", addrs[i], "-name", fmt.Sprintf("v%d", i))
	}
	procs := []*proc{supervise(0), supervise(1), supervise(2)}
	testutil.Eventually(t, "three backends", func() bool { return len(g.seenBy("/orders/", 12)) == 3 })

	ctx, cancel := context.WithCancel(context.Background())
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				code, body, err := g.hit("/orders/")
				sent.Add(1)
				if err != nil || code != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %q %v", code, body, err))
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	for i := range procs {
		procs[i].stop(t)
		if procs[i].cmd.ProcessState.ExitCode() != 0 {
			t.Errorf("announce %d exited %d", i, procs[i].cmd.ProcessState.ExitCode())
		}
		procs[i] = supervise(i)
		name := fmt.Sprintf("v%d", i)
		testutil.Eventually(t, name+" back", func() bool { return g.seenBy("/orders/", 9)[name+" /"] > 0 })
	}
	cancel()
	wg.Wait()
	t.Logf("rolling restart: %d requests, %d failed", sent.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed during the rolling restart; first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}
}

func TestBadConfigExitsTwo(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listn: oops\n"), 0o600)
	for _, args := range [][]string{{"-config", bad}, {"-log-level", "loud"}, {"stray"}, {"-gossip", "127.0.0.1:1", "-gossip-key", "short"}} {
		cmd := exec.Command(bin.gateway, args...)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 {
			t.Errorf("gateway %v exited %d, want 2: %s", args, cmd.ProcessState.ExitCode(), out)
		}
	}
	out, _ := exec.Command(bin.gateway, "-config", bad).CombinedOutput()
	if !strings.Contains(string(out), "listn") {
		t.Errorf("the error should name the bad key: %s", out)
	}
}

// BenchmarkGatewayVsDirect measures, in the same run, requests sent straight
// to a backend and through the real gateway binary (embedded NATS, the
// backend announced by a real announce process): throughput with 8
// concurrent clients and per-request latency percentiles.
func BenchmarkGatewayVsDirect(b *testing.B) {
	g := startGateway(b, b.TempDir(), freePort(b))
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
	g := startGateway(t, t.TempDir(), freePort(t))
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(700 * time.Millisecond)
		fmt.Fprint(w, "slow")
	}))
	t.Cleanup(slow.Close)
	announceHold(t, g, "slow", slow.Listener.Addr().String())
	testutil.Eventually(t, "the backend listed", func() bool { return strings.Count(g.state(t), `"id"`) == 1 })
	type result struct {
		code int
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, body, err := g.hit("/slow/")
		done <- result{code, body, err}
	}()
	time.Sleep(200 * time.Millisecond) // the request is in flight
	g.cmd.Process.Signal(syscall.SIGTERM)
	r := <-done
	if r.err != nil || r.code != 200 || r.body != "slow" {
		t.Fatalf("in-flight request: %d %q %v", r.code, r.body, r.err)
	}
	select {
	case <-g.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the gateway did not exit")
	}
	if code := g.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	if _, _, err := g.hit("/slow/"); err == nil {
		t.Fatal("the gateway still accepts requests after exiting")
	}
}
