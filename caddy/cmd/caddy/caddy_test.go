package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/subscriber"
)

// TestExampleCaddyfile runs caddy/example.Caddyfile as it is, with its
// variables set in the environment: one site sends /orders/x to /x on an
// instance of orders and /billing/y to /y on one of billing; a service
// nobody announced gets 503; pushlb's logs come out through Caddy's
// logger, in its format.
func TestExampleCaddyfile(t *testing.T) {
	srv := natstest.Start(t)
	example, err := os.ReadFile("../../example.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	c := startCaddy(t, func(admin, listen string) string { return string(example) }, "PUSHLB_NATS="+srv.URL(), "PUSHLB_ZONE=a")
	announceBackend(t, srv.URL(), "orders", "a", "orders-1")
	announceBackend(t, srv.URL(), "billing", "b", "billing-1")
	cl := client(t)
	for path, want := range map[string]string{"/orders/x": "orders-1 /x\n", "/billing/y/z": "billing-1 /y/z\n"} {
		var body string
		testutil.Eventually(t, path+" through caddy", func() bool {
			var code int
			code, body, _ = testutil.Fetch(cl, "http://"+c.listen+path)
			return code == 200 && body == want
		})
	}
	if code, body, err := testutil.Fetch(cl, "http://"+c.listen+"/nobody/x"); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("a service nobody announced: %d %q %v, want 503", code, body, err)
	}
	// pushlb's state is in Caddy's metrics.
	if code, body, err := testutil.Fetch(cl, "http://"+c.admin+"/metrics"); err != nil || code != 200 ||
		!regexp.MustCompile(`pushlb_servers\{registry="nats://[^"]+ prefix lb",service="orders"\} 1`).MatchString(body) {
		t.Fatalf("caddy's metrics: %d %v, no pushlb_servers for orders:\n%s", code, err, grepLines(body, "pushlb_"))
	}
	// pushlb's lines are Caddy's JSON log entries, named pushlb.
	l := c.WaitFor(t, "server list changed", lineTimeout)
	if !strings.Contains(l.Text, `"logger":"pushlb"`) || !strings.Contains(l.Text, `"service":"orders"`) && !strings.Contains(l.Text, `"service":"billing"`) {
		t.Fatalf("pushlb's list change is not a Caddy log entry of logger pushlb: %s", l.Text)
	}
}

// TestRollingRestartUnderLoad: four instances are restarted one after
// the other (announce withdraws each, drains, stops it; a new one starts
// and is announced) under steady load through caddy: no request fails,
// and each new instance answers from its announcement on (the delay is
// logged).
func TestRollingRestartUnderLoad(t *testing.T) {
	srv := natstest.Start(t)
	c := startCaddy(t, func(admin, listen string) string {
		return site(admin, listen, pushlbSource(srv.URL(), "a")+"\t\tlb_policy pushlb")
	})
	var bs []*backend
	for i := range 4 {
		bs = append(bs, announceBackend(t, srv.URL(), "orders", "a", fmt.Sprintf("orders-%d", i)))
	}
	l := startLoad(t, "http://"+c.listen+"/x", 4)
	testutil.Eventually(t, "every instance answering", func() bool {
		for _, b := range bs {
			if _, ok := l.firstAnswer(b.name); !ok {
				return false
			}
		}
		return true
	})
	var delays []time.Duration
	for i, old := range bs {
		old.announce.Signal(t, syscall.SIGTERM)
		if code := old.announce.Wait(t, lineTimeout); code != 0 {
			t.Fatalf("announce of %s exited %d", old.name, code)
		}
		nb := &backend{name: fmt.Sprintf("orders-%d-v2", i), addr: testutil.FreeAddr(t)}
		nb.announce = testutil.Start(t, bin.announce, "-nats", srv.URL(), "-service", "orders", "-addr", nb.addr, "-zone", "a",
			"--", bin.backend, "-addr", nb.addr, "-name", nb.name)
		announced := nb.announce.WaitFor(t, "announced online", lineTimeout)
		var first time.Time
		testutil.Eventually(t, nb.name+" answering", func() bool {
			var ok bool
			first, ok = l.firstAnswer(nb.name)
			return ok
		})
		delays = append(delays, first.Sub(announced.At))
		bs[i] = nb
	}
	before := l.answers()
	testutil.Eventually(t, "more answers after the last restart", func() bool { return l.answers() > before+100 })
	l.end()
	if f := l.failures(); len(f) > 0 {
		t.Fatalf("%d of %d requests failed during the rolling restart: %v", len(f), l.answers()+len(f), f[:min(len(f), 10)])
	}
	t.Logf("rolling restart of 4 instances: %d requests, 0 failed; from announce's \"announced online\" to the new instance's first answer through caddy: %v",
		l.answers(), delays)
}

// TestCrashRemovedByGossip: caddy joins gossip (gossip in the source's
// block, fast profile) and instances join it (announce -gossip). When an
// instance's announce is SIGKILLed, caddy stops routing to the instance
// within the gossip bound: the instance's server keeps running here, so
// the last request it gets tells when routing stopped.
func TestCrashRemovedByGossip(t *testing.T) {
	srv := natstest.Start(t)
	gossipAddr := testutil.FreeAddr(t)
	c := startCaddy(t, func(admin, listen string) string {
		return site(admin, listen, pushlbSource(srv.URL(), "a", "gossip "+gossipAddr+" {", "\tprofile fast", "}")+"\t\tlb_policy pushlb")
	})
	type instance struct {
		name     string
		srv      *httptest.Server
		last     atomic.Int64 // unix ns of its last request
		announce *testutil.Proc
	}
	var ins []*instance
	for i := range 3 {
		in := &instance{name: fmt.Sprintf("g-%d", i)}
		in.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			in.last.Store(time.Now().UnixNano())
			w.Header().Set("X-Backend", in.name)
		}))
		t.Cleanup(in.srv.Close)
		in.announce = testutil.Start(t, bin.announce, "-nats", srv.URL(), "-service", "orders", "-addr", in.srv.Listener.Addr().String(),
			"-zone", "a", "-gossip", gossipAddr, "-gossip-bind", "127.0.0.1:0", "-gossip-profile", "fast")
		in.announce.WaitFor(t, "gossip member", lineTimeout)
		ins = append(ins, in)
	}
	l := startLoad(t, "http://"+c.listen+"/x", 2)
	testutil.Eventually(t, "every instance answering", func() bool {
		for _, in := range ins {
			if _, ok := l.firstAnswer(in.name); !ok {
				return false
			}
		}
		return true
	})
	// The removal's cause is asserted, not its speed (a loaded 2-core
	// machine runs every node here; BenchmarkDetection measures speed):
	// it comes long before announce's 30 s lease could end it.
	_, bound := gossip.ProfileFast.DetectionTime(4) // caddy and three instances
	const leaseBound = 15 * time.Second             // half announce's default lease

	crashed := ins[0]
	crashed.announce.Kill(t)
	killed := time.Now()
	port := crashed.srv.Listener.Addr().String()[strings.LastIndex(crashed.srv.Listener.Addr().String(), ":")+1:]
	removed, _ := c.WaitForRegexp(t, regexp.MustCompile(`server list changed.*`+port+`.*"size":2|"size":2.*server list changed.*`+port), bound+lineTimeout)
	// Routing has stopped once the next answers all come from the others.
	probe := client(t)
	testutil.Eventually(t, "20 answers in a row from the other instances", func() bool {
		for range 20 {
			if name, err := answeredBy(probe, "http://"+c.listen+"/x"); err != nil || name == crashed.name {
				return false
			}
		}
		return true
	})
	l.end()
	stopped := time.Unix(0, crashed.last.Load()).Sub(killed)
	if stopped > leaseBound {
		t.Errorf("routing to the crashed instance stopped %v after its crash: not gossip's nor an advisory's doing (gossip's bound %v), the lease's", stopped, bound)
	}
	if f := l.failures(); len(f) > 0 {
		t.Errorf("%d requests failed (the instance's server was up): %v", len(f), f[:min(len(f), 10)])
	}
	t.Logf("crash of an announce (gossip fast profile): removed from caddy's list %v after the SIGKILL, last request routed to it %v after (bound %v)",
		removed.At.Sub(killed), stopped, bound)
}

// TestReloadsKeepTheClient: twenty `caddy reload`s that change the zone,
// under load: no request fails, each reload's zone is preferred at once,
// the NATS connection is the same (no new one, none lost), and the
// goroutine count stays flat.
func TestReloadsKeepTheClient(t *testing.T) {
	srv := natstest.Start(t)
	config := func(zone string) func(admin, listen string) string {
		return func(admin, listen string) string {
			// A connection to an instance busy when a config is replaced
			// goes back to the replaced config's transport after its
			// cleanup closed the idle ones, and stays until its idle
			// timeout (Caddy's behaviour, static upstreams too): a short
			// one here, so that the count measures what the configs
			// leave behind.
			return site(admin, listen, pushlbSource(srv.URL(), zone)+"\t\tlb_policy pushlb\n\t\ttransport http {\n\t\t\tkeepalive 1s\n\t\t}")
		}
	}
	c := startCaddy(t, config("a"))
	zoneOf := map[string]string{}
	for _, zone := range []string{"a", "b"} {
		for i := range 2 {
			b := announceBackend(t, srv.URL(), "orders", zone, fmt.Sprintf("%s-%d", zone, i))
			zoneOf[b.name] = zone
		}
	}
	probe := client(t)
	// preferred waits until ten answers in a row come from zone.
	preferred := func(zone string) {
		t.Helper()
		testutil.Eventually(t, "answers from zone "+zone, func() bool {
			for range 10 {
				if name, err := answeredBy(probe, "http://"+c.listen+"/x"); err != nil || zoneOf[name] != zone {
					return false
				}
			}
			return true
		})
	}
	preferred("a")
	conns := srv.NumClientsExcept(t, subscriber.AdvisoryCheckName) // four announces and caddy

	zones := []string{"b", "a"}
	reloads := func(n int) {
		for range n {
			zone := zones[0]
			zones[0], zones[1] = zones[1], zones[0]
			c.reload(t, config(zone))
			preferred(zone)
		}
	}
	// Two reloads warm up (the first reload's transport, its
	// connections), then the count is taken with no load in flight.
	l := startLoad(t, "http://"+c.listen+"/x", 4)
	reloads(2)
	l.end()
	settled := func() int {
		probe.CloseIdleConnections()
		l.http.CloseIdleConnections()
		return c.goroutines(t)
	}
	g0 := settled()
	// Caddy's reload may close a connection it has just accepted (the
	// client gets EOF, or a reset when the request was still unread,
	// before any answer: about 1 request in 3,500 on a loaded machine):
	// the load retries those once, as an idempotent client would, and the
	// test bounds them.
	l = startLoadWith(t, "http://"+c.listen+"/x", 4, true)
	reloads(18)
	l.end()
	var g1 int
	testutil.Eventually(t, "the goroutines of the replaced configs to end", func() bool {
		g1 = settled()
		return g1 <= g0+5
	})
	if f := l.failures(); len(f) > 0 {
		t.Fatalf("%d of %d requests failed across the reloads: %v", len(f), l.answers()+len(f), f[:min(len(f), 10)])
	}
	if r := l.retriedCount(); r > 3 {
		t.Fatalf("%d requests met a connection closed before any answer across 18 reloads, want at most 3", r)
	}
	if n := srv.NumClientsExcept(t, subscriber.AdvisoryCheckName); n != conns {
		t.Fatalf("%d NATS connections after 20 reloads, %d before", n, conns)
	}
	t.Logf("20 reloads changing the zone: %d requests through them, 0 failed (%d retried once after a connection closed before any answer); goroutines %d after 2 reloads, %d after 20; NATS connections %d before and after",
		l.answers(), l.retriedCount(), g0, g1, conns)
}

// TestZonesAndBreaker: with the pushlb policy, caddy prefers its zone's
// instance as the gateway does; an instance of its zone that fails every
// request is tried three times (the breaker's threshold), then left for
// the other zone while its breaker is open, and Caddy's retries
// (lb_try_duration) hide the three failures from the clients.
func TestZonesAndBreaker(t *testing.T) {
	srv := natstest.Start(t)
	c := startCaddy(t, func(admin, listen string) string {
		return site(admin, listen, pushlbSource(srv.URL(), "a")+"\t\tlb_policy pushlb\n\t\tlb_try_duration 5s\n\t\tlb_try_interval 10ms")
	})
	local := announceBackend(t, srv.URL(), "orders", "a", "a-1")
	announceBackend(t, srv.URL(), "orders", "b", "b-1")
	announceBackend(t, srv.URL(), "orders", "b", "b-2")
	cl := client(t)
	url := "http://" + c.listen + "/x"
	testutil.Eventually(t, "three instances listed", func() bool {
		return strings.Count(c.Output(), `server list changed`) >= 3
	})
	for i := range 30 {
		if name, err := answeredBy(cl, url); err != nil || name != "a-1" {
			t.Fatalf("request %d: %q %v, want a-1 (caddy's zone)", i, name, err)
		}
	}

	// Zone a's only instance now fails every request.
	local.announce.Signal(t, syscall.SIGTERM)
	local.announce.Wait(t, lineTimeout)
	broken := brokenListener(t)
	testpub.AnnounceAddr(t, srv.Connect(t), "orders", "a", "broken", broken.addr())
	testutil.Eventually(t, "the broken instance listed", func() bool { return listed(c, "broken") })
	seen := map[string]int{}
	for i := range 60 {
		name, err := answeredBy(cl, url)
		if err != nil {
			t.Fatalf("request %d failed: %v", i, err)
		}
		seen[name]++
	}
	if n := broken.accepted.Load(); n > 3 {
		t.Fatalf("the broken instance got %d connections in 60 requests, want at most 3 (the breaker's threshold)", n)
	}
	t.Logf("zone a's broken instance: %d connections in 60 requests, all answered (by %v)", broken.accepted.Load(), seen)
}

// listed reports whether caddy logged a list change naming id.
func listed(c *caddyProc, id string) bool {
	for _, l := range c.Lines() {
		if strings.Contains(l.Text, "server list changed") && strings.Contains(l.Text, `"`+id+` (`) {
			return true
		}
	}
	return false
}

// TestPassiveHealthAndRetries: Caddy's own policy over the pushed list,
// with its passive health checks and retries: the broken instance fails
// once, is marked unhealthy (dynamic upstreams keep their health state),
// and is not tried again within fail_duration; no request fails.
func TestPassiveHealthAndRetries(t *testing.T) {
	srv := natstest.Start(t)
	c := startCaddy(t, func(admin, listen string) string {
		return site(admin, listen, pushlbSource(srv.URL(), "a")+
			"\t\tlb_policy round_robin\n\t\tlb_try_duration 5s\n\t\tlb_try_interval 10ms\n\t\tfail_duration 30s\n\t\tmax_fails 1")
	})
	announceBackend(t, srv.URL(), "orders", "a", "a-1")
	announceBackend(t, srv.URL(), "orders", "b", "b-1")
	broken := brokenListener(t)
	testpub.AnnounceAddr(t, srv.Connect(t), "orders", "a", "broken", broken.addr())
	testutil.Eventually(t, "three instances listed", func() bool { return listed(c, "broken") })
	cl := client(t)
	seen := map[string]int{}
	for i := range 60 {
		name, err := answeredBy(cl, "http://"+c.listen+"/x")
		if err != nil {
			t.Fatalf("request %d failed: %v", i, err)
		}
		seen[name]++
	}
	if n := broken.accepted.Load(); n != 1 {
		t.Fatalf("the broken instance got %d connections in 60 requests, want 1 (max_fails 1, fail_duration 30s)", n)
	}
	if seen["a-1"] == 0 || seen["b-1"] == 0 {
		t.Fatalf("answers %v: round_robin should use both live instances", seen)
	}
}

// TestNATSLostKeepsTheLists: when the NATS server goes away, caddy keeps
// routing to the instances it knew and says so in its log; when it comes
// back, caddy reconnects.
func TestNATSLostKeepsTheLists(t *testing.T) {
	srv := natstest.Start(t)
	c := startCaddy(t, func(admin, listen string) string {
		return site(admin, listen, pushlbSource(srv.URL(), "a")+"\t\tlb_policy pushlb")
	})
	b := announceBackend(t, srv.URL(), "orders", "a", "a-1", "-nats-timeout", "1m")
	cl := client(t)
	url := "http://" + c.listen + "/x"
	testutil.Eventually(t, "the instance answering", func() bool { name, _ := answeredBy(cl, url); return name == "a-1" })
	srv.Shutdown()
	l := c.WaitFor(t, "disconnected from NATS", lineTimeout)
	if !strings.Contains(l.Text, `"logger":"pushlb"`) || !strings.Contains(l.Text, `"level":"warn"`) {
		t.Fatalf("the disconnect is not a Caddy warning of logger pushlb: %s", l.Text)
	}
	for i := range 20 {
		if name, err := answeredBy(cl, url); err != nil || name != "a-1" {
			t.Fatalf("request %d without NATS: %q %v", i, name, err)
		}
	}
	srv.Restart(t)
	c.WaitFor(t, "reconnected to NATS", lineTimeout)
	b.announce.WaitFor(t, "re-announced", lineTimeout) // after its reconnect
	for i := range 20 {
		if name, err := answeredBy(cl, url); err != nil || name != "a-1" {
			t.Fatalf("request %d after NATS came back: %q %v", i, name, err)
		}
	}
}

// TestBadConfig: a mistake in the Caddyfile is reported by Caddy with
// the file, the line and the subdirective; a NATS server that cannot be
// reached fails the start within connect_timeout, saying so.
func TestBadConfig(t *testing.T) {
	dir := t.TempDir()
	run := func(t *testing.T, body string, args ...string) (string, error) {
		file := dir + "/Caddyfile." + strings.ReplaceAll(t.Name(), "/", "_")
		content := globals(testutil.FreeAddr(t)) + "http://127.0.0.1:1 {\n\treverse_proxy {\n" + body + "\n\t}\n}\n"
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin.caddy, append(args, "--config", file, "--adapter", "caddyfile")...)
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"unknown subdirective", "\t\tdynamic pushlb orders {\n\t\t\tzoen a\n\t\t}", []string{`unrecognized pushlb subdirective \"zoen\"`, "Caddyfile", ":9"}},
		{"no service", "\t\tdynamic pushlb {\n\t\t\tzone a\n\t\t}", []string{"pushlb: no service"}},
		{"bad policy option", "\t\tdynamic pushlb orders\n\t\tlb_policy pushlb {\n\t\t\thash_all x\n\t\t}", []string{`unrecognized pushlb policy subdirective \"hash_all\"`, ":10"}},
		{"unknown rule", "\t\tdynamic pushlb orders {\n\t\t\trule Fastest\n\t\t}", []string{"Fastest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, tc.body, "validate")
			if err == nil {
				t.Fatalf("caddy validate accepted it:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Fatalf("caddy validate's output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	t.Run("unreachable NATS", func(t *testing.T) {
		began := time.Now()
		out, err := run(t, "\t\tdynamic pushlb orders {\n\t\t\tnats nats://"+testutil.FreeAddr(t)+"\n\t\t\tconnect_timeout 500ms\n\t\t}", "run")
		if err == nil || !strings.Contains(out, "cannot reach NATS") || !strings.Contains(out, "http.reverse_proxy.upstreams.pushlb") {
			t.Fatalf("caddy run: %v\n%s", err, out)
		}
		t.Logf("caddy run failed after %v: %s", time.Since(began).Round(time.Millisecond), lastLine(out))
	})
}

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
