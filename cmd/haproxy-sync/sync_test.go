package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	tu "github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

const ordersBackend = `backend orders
  balance roundrobin
  server static1 127.0.0.1:1 disabled
`

// TestServersAppearAndLeave: instances announced are added to the
// backend and receive HAProxy's requests; one withdrawn leaves it; the
// configuration's own server is left alone throughout.
func TestServersAppearAndLeave(t *testing.T) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders"})
	a := announce(t, ns, "orders", "orders-a", "", 0)
	sync := startSync(t, "-nats", ns.URL(), "-socket", h.sock, "orders")
	b := announce(t, ns, "orders", "10.0.0.1:orders:80/b", "", 0) // an ID HAProxy cannot take as a name

	h.waitServers(t, "orders", "both instances in the backend", func(s map[string]*haServer) bool {
		o := ours(s)
		return len(o) == 2 && s["static1"] != nil && o[defaultNamePrefix+"orders-a"] != nil
	})
	for name, s := range ours(h.servers(t, "orders")) {
		if s.maint() || s.draining() || s.Weight != 26 {
			t.Fatalf("server %s: admin state %#x, weight %d; want ready, 26 (pushlb's default 100)", name, s.Admin, s.Weight)
		}
	}
	client := &http.Client{Timeout: 5 * time.Second}
	tu.Eventually(t, "requests through HAProxy reach both instances", func() bool {
		_, _, _ = get(client, h.url("/x"))
		return a.hits.Load() > 0 && b.hits.Load() > 0
	})

	a.withdraw(t)
	h.waitServers(t, "orders", "the withdrawn instance gone", func(s map[string]*haServer) bool {
		o := ours(s)
		return len(o) == 1 && o[defaultNamePrefix+"orders-a"] == nil
	})
	if h.servers(t, "orders")["static1"] == nil {
		t.Fatal("the configuration's server static1 was removed")
	}
	before := a.hits.Load()
	for range 20 {
		if code, body, err := get(client, h.url("/y")); err != nil || code != 200 || !strings.HasPrefix(body, b.id) {
			t.Fatalf("after the withdrawal: %d %q %v, want 200 from %s", code, body, err, b.id)
		}
	}
	if n := a.hits.Load(); n != before {
		t.Fatalf("the withdrawn instance received %d requests after it left", n-before)
	}
	sync.waitLog(t, "server deleted", defaultNamePrefix+"orders-a")
}

// TestDrainBeforeDelete: a withdrawn instance with a request in flight is
// drained (no new request, the one in flight answered), and deleted only
// once it has no session left.
func TestDrainBeforeDelete(t *testing.T) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders"})
	slow := announce(t, ns, "orders", "slow", "", 0)
	startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-drain-timeout", "30s", "orders")
	name := defaultNamePrefix + "slow"
	h.waitServers(t, "orders", "the instance added", func(s map[string]*haServer) bool { return s[name] != nil && !s[name].maint() })

	client := &http.Client{Timeout: 30 * time.Second}
	type answer struct {
		code int
		body string
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		code, body, err := get(client, h.url("/slow"))
		done <- answer{code, body, err}
	}()
	h.waitServers(t, "orders", "the slow request in the server", func(s map[string]*haServer) bool { return s[name].Sessions == 1 })

	slow.withdraw(t)
	h.waitServers(t, "orders", "the server draining", func(s map[string]*haServer) bool { return s[name] != nil && s[name].draining() })
	if s := h.servers(t, "orders")[name]; s == nil || s.maint() {
		t.Fatalf("the server was put in maintenance or deleted with a request in flight: %+v", s)
	}
	close(slow.block)
	got := tu.Receive(t, done, 20*time.Second, "the slow request's answer")
	if got.err != nil || got.code != 200 || got.body != "slow /slow" {
		t.Fatalf("the request in flight got %d %q %v, want 200 from the drained server", got.code, got.body, got.err)
	}
	h.waitServers(t, "orders", "the drained server deleted", func(s map[string]*haServer) bool { return s[name] == nil })
}

// TestCrashIsNotDrained: an instance whose process dies (its listener and
// its NATS connection close: the server's advisory) is put in maintenance
// and deleted at once, without a drain.
func TestCrashIsNotDrained(t *testing.T) {
	ns := natstest.Start(t, natstest.WithAdvisories(t, "lb"))
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders"})
	gone := announce(t, ns, "orders", "gone", "", 0)
	kept := announce(t, ns, "orders", "kept", "", 0)
	sync := startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-drain-timeout", "1m", "orders")
	h.waitServers(t, "orders", "both added", func(s map[string]*haServer) bool { return len(ours(s)) == 2 })

	gone.crash()
	h.waitServers(t, "orders", "the crashed instance deleted", func(s map[string]*haServer) bool {
		o := ours(s)
		return len(o) == 1 && o[defaultNamePrefix+kept.id] != nil
	})
	sync.waitLog(t, "server deleted", `"crash":true`)
	if strings.Contains(sync.log.String(), "server draining") {
		t.Fatal("the crashed instance was drained")
	}
}

// TestWeightsAndZones: pushlb's weights (1 to 1,000) become HAProxy's (1
// to 256), and with -zone the other zones' instances are backups.
func TestWeightsAndZones(t *testing.T) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend + "  option allbackups\n", frontend: "orders"})
	announce(t, ns, "orders", "heavy", "a", 1000)
	announce(t, ns, "orders", "light", "A", 1)
	announce(t, ns, "orders", "remote", "b", 300)
	announce(t, ns, "orders", "nowhere", "", 0)
	startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-zone", "a", "orders")

	want := map[string]struct {
		weight int
		backup bool
	}{"heavy": {256, false}, "light": {1, false}, "remote": {77, true}, "nowhere": {26, false}}
	h.waitServers(t, "orders", "four instances", func(s map[string]*haServer) bool { return len(ours(s)) == 4 })
	for id, w := range want {
		s := h.servers(t, "orders")[defaultNamePrefix+id]
		if s == nil || s.Weight != w.weight || s.Backup != w.backup {
			t.Errorf("%s: %+v, want weight %d backup %v", id, s, w.weight, w.backup)
		}
	}
}

// TestHAProxyRestartReconciled: HAProxy killed and started again (its
// dynamic servers gone), then reloaded in master-worker mode: the sync
// sees the new process and adds the servers again, without a change of
// the list; a server of its prefix that pushlb does not list (left by an
// earlier run) is removed, and the configuration's are kept.
func TestHAProxyRestartReconciled(t *testing.T) {
	t.Run("master CLI", func(t *testing.T) { testRestartReconciled(t, true) })
	t.Run("stats socket", func(t *testing.T) { testRestartReconciled(t, false) })
}

func testRestartReconciled(t *testing.T, master bool) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders", masterWorker: true})
	h.exec(t, "add server orders/"+defaultNamePrefix+"stale 127.0.0.1:2", "New server registered.")
	announce(t, ns, "orders", "one", "", 0)
	announce(t, ns, "orders", "two", "", 0)
	socket := []string{"-socket", h.sock}
	if master {
		socket = []string{"-socket", h.masterSock, "-master"}
	}
	sync := startSync(t, append(socket, "-nats", ns.URL(), "-poll", "50ms", "orders")...)
	both := func(s map[string]*haServer) bool {
		o := ours(s)
		return len(o) == 2 && o[defaultNamePrefix+"one"] != nil && o[defaultNamePrefix+"two"] != nil && s["static1"] != nil
	}
	h.waitServers(t, "orders", "both instances and no stale server", both)

	h.reload(t)
	sync.waitLog(t, "HAProxy restarted or reloaded")
	h.waitServers(t, "orders", "both instances again after the reload", both)

	h.restart(t)
	h.waitServers(t, "orders", "both instances again after the restart", both)
}

// TestStaticBackendDoesNotStopTheOthers: a backend balanced with static-rr
// (which takes no server at runtime) and an unknown backend are refused,
// logged and counted (on -metrics), and the other backend syncs.
func TestStaticBackendDoesNotStopTheOthers(t *testing.T) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend + "backend fixed\n  balance static-rr\n", frontend: "orders"})
	announce(t, ns, "orders", "o1", "", 0)
	announce(t, ns, "fixed", "f1", "", 0)
	announce(t, ns, "ghost", "g1", "", 0)
	metrics := tu.FreeAddr(t)
	sync := startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-metrics", metrics, "fixed", "ghost=nosuch", "orders")
	h.waitServers(t, "orders", "orders synced", func(s map[string]*haServer) bool { return len(ours(s)) == 1 })
	sync.waitLog(t, "static_algorithm", "fixed")
	sync.waitLog(t, "unknown_backend", "nosuch")
	client := &http.Client{Timeout: 5 * time.Second}
	url := "http://" + metrics + "/metrics"
	tu.Eventually(t, "the refusals counted", func() bool {
		return tu.Metric(client, url, `pushlb_haproxy_sync_errors_total{backend="fixed",kind="static_algorithm"}`) >= 1 &&
			tu.Metric(client, url, `pushlb_haproxy_sync_errors_total{backend="nosuch",kind="unknown_backend"}`) >= 1 &&
			tu.Metric(client, url, `pushlb_haproxy_sync_ops_total{backend="orders",op="add"}`) == 1
	})
	if n := len(ours(h.servers(t, "fixed"))); n != 0 {
		t.Fatalf("the static-rr backend has %d servers of ours", n)
	}
}

// TestBadSocket: a socket that does not exist is a clear error at start.
func TestBadSocket(t *testing.T) {
	var stderr bytes.Buffer
	code := run(t.Context(), []string{"-socket", "/nonexistent/haproxy.sock", "-nats", "nats://127.0.0.1:1", "orders"}, &bytes.Buffer{}, &stderr)
	if code != exitFailure || !strings.Contains(stderr.String(), "unix:/nonexistent/haproxy.sock") || !strings.Contains(stderr.String(), "no such file") {
		t.Fatalf("exit %d, log %s; want 1 naming the socket", code, stderr.String())
	}
}

// TestHostNameResolved: an instance announced with a host name is added
// with its address (HAProxy 2.6's add server resolves nothing); with
// -resolve=false it is left out and counted.
func TestHostNameResolved(t *testing.T) {
	for _, resolve := range []bool{true, false} {
		t.Run(map[bool]string{true: "resolve", false: "refuse"}[resolve], func(t *testing.T) {
			o := &options{resolve: resolve, namePrefix: defaultNamePrefix}
			b := newBackendSync("orders", "orders", nil, o, zerologNop(), newMetrics())
			want := b.targets(t.Context(), []instance{{ID: "x", Host: "localhost", Port: 80}})
			switch {
			case resolve && (len(want) != 1 || want[defaultNamePrefix+"x"].addr == "localhost"):
				t.Fatalf("targets %+v, want localhost resolved", want)
			case !resolve && len(want) != 0:
				t.Fatalf("targets %+v, want none", want)
			case !resolve && counter(b.m, "pushlb_haproxy_sync_errors_total", "kind", "host_name") != 1:
				t.Fatal("the refusal was not counted")
			}
		})
	}
}

func TestHAProxyWeight(t *testing.T) {
	for in, want := range map[int]int{0: 26, 1: 1, 2: 1, 5: 1, 6: 2, 100: 26, 300: 77, 500: 128, 999: 256, 1000: 256} {
		if got := haproxyWeight(in); got != want {
			t.Errorf("haproxyWeight(%d) = %d, want %d", in, got, want)
		}
	}
}

func TestServerName(t *testing.T) {
	o := &options{namePrefix: defaultNamePrefix}
	if got := o.serverName("orders-1"); got != "pushlb-orders-1" {
		t.Fatalf("plain ID: %q", got)
	}
	a, b := o.serverName("a/b"), o.serverName("a b")
	if a == b || !strings.HasPrefix(a, "pushlb-a_b-") {
		t.Fatalf("IDs with characters HAProxy refuses: %q and %q", a, b)
	}
	long := o.serverName(strings.Repeat("x", 300))
	if len(long) > 80 || !o.ours(long) {
		t.Fatalf("long ID: %q", long)
	}
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error; "" for none
	}{
		{[]string{"-socket", "/run/h.sock", "orders", "pay=be_pay"}, ""},
		{[]string{"orders"}, "-socket is required"},
		{[]string{"-socket", "/s"}, "no service"},
		{[]string{"-socket", "/s", "a=x", "b=x"}, "given twice"},
		{[]string{"-socket", "/s", "bad.name"}, "bad.name"},
		{[]string{"-socket", "/s", "-poll", "0s", "a"}, "-poll"},
		{[]string{"-socket", "/s", "-name-prefix", "a/b", "a"}, "-name-prefix"},
	} {
		o, err := parseArgs(tc.args, &bytes.Buffer{})
		var uerr *usageError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.want != "" && (!errors.As(err, &uerr) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want a usage error with %q", tc.args, err, tc.want)
		case tc.want == "" && (len(o.follow) != 2 || o.follow[1] != follow{"pay", "be_pay"}):
			t.Errorf("%q: follows %+v", tc.args, o.follow)
		}
	}
}

var _ = context.Background

// TestDocConfigIsValid: docs/haproxy.md's haproxy.cfg passes haproxy -c,
// and its -config file is read.
func TestDocConfigIsValid(t *testing.T) {
	bin := tu.Tool(t, "haproxy", "haproxy")
	doc, err := os.ReadFile("../../docs/haproxy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```haproxy\n")
	cfg, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/haproxy.md has no ```haproxy block")
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}

	_, rest, _ = strings.Cut(string(doc), "```yaml\n")
	yaml, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/haproxy.md has no ```yaml block")
	}
	path = filepath.Join(t.TempDir(), "sync.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseArgs([]string{"-config", path}, &bytes.Buffer{})
	if err != nil || len(o.follow) != 2 || !o.check {
		t.Fatalf("the doc's -config file: %v, %+v", err, o)
	}
}

// TestHealthChecks: with -check, a server is added with its health check
// on, and HAProxy's check marks an instance that stops answering down
// while pushlb still lists it.
func TestHealthChecks(t *testing.T) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders"})
	b := announce(t, ns, "orders", "checked", "", 0)
	startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-check", "-server-options", "inter 100ms fall 1 rise 1", "orders")
	name := defaultNamePrefix + "checked"
	h.waitServers(t, "orders", "the server up by its check", func(s map[string]*haServer) bool {
		return s[name] != nil && strings.HasPrefix(s[name].Status, "UP")
	})
	b.srv.Listener.Close() // no longer accepts; its announcement stays
	h.waitServers(t, "orders", "the server down by its check", func(s map[string]*haServer) bool {
		return s[name] != nil && strings.HasPrefix(s[name].Status, "DOWN")
	})
}

// TestConfigFile: -config's settings and backends, a flag given winning
// over the file, an unknown key named with its line.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sync.yaml")
	yaml := "socket: /run/haproxy/admin.sock\nzone: a\ndrainTimeout: 3s\nnats:\n  url: nats://nats-1:4222\nbackends:\n  - service: orders\n    backend: be_orders\n  - service: pay\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseArgs([]string{"-config", path, "-zone", "b", "users"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := []follow{{"users", "users"}, {"orders", "be_orders"}, {"pay", "pay"}}
	if o.socket != "/run/haproxy/admin.sock" || o.zone != "b" || o.drainTimeout != 3*time.Second ||
		o.nats.URL != "nats://nats-1:4222" || fmt.Sprint(o.follow) != fmt.Sprint(want) {
		t.Fatalf("options %+v", o)
	}
	if err := os.WriteFile(path, []byte("socket: /s\nzonee: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseArgs([]string{"-config", path, "orders"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "sync.yaml:2") || !strings.Contains(err.Error(), "zonee") {
		t.Fatalf("an unknown key: %v", err)
	}
}

// TestChangesInPlace: an instance announced again with another weight
// keeps its server, whose weight changes; announced again in another
// zone, its server leaves and comes back as a backup.
func TestChangesInPlace(t *testing.T) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders"})
	b := announce(t, ns, "orders", "moving", "a", 100)
	startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-zone", "a", "orders")
	name := defaultNamePrefix + "moving"
	h.waitServers(t, "orders", "the server added", func(s map[string]*haServer) bool { return s[name] != nil && s[name].Weight == 26 })

	in := b.pub.Instance()
	in.Weight = 500
	if err := b.pub.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	h.waitServers(t, "orders", "its weight changed", func(s map[string]*haServer) bool { return s[name] != nil && s[name].Weight == 128 })
	in.Zone = "b"
	if err := b.pub.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	h.waitServers(t, "orders", "the server back as a backup", func(s map[string]*haServer) bool {
		return s[name] != nil && s[name].Backup && !s[name].maint() && !s[name].draining()
	})
}

// TestTCPSocket: the runtime API over a TCP stats socket.
func TestTCPSocket(t *testing.T) {
	ns := natstest.Start(t)
	addr := tu.FreeAddr(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders", global: "  stats socket ipv4@" + addr + " level admin\n"})
	announce(t, ns, "orders", "over-tcp", "", 0)
	startSync(t, "-nats", ns.URL(), "-socket", "tcp:"+addr, "orders")
	h.waitServers(t, "orders", "the instance added over TCP", func(s map[string]*haServer) bool { return s[defaultNamePrefix+"over-tcp"] != nil })
}

// TestCrashSeenByGossip: with gossip on (-gossip-bind) and no disconnect
// advisories, an instance whose gossip node vanishes (its publisher closed
// without leaving) is put in maintenance and deleted without a drain.
func TestCrashSeenByGossip(t *testing.T) {
	ns := natstest.Start(t)
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend, frontend: "orders"})
	gossipAddr := tu.FreeAddr(t)
	sync := startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-drain-timeout", "1m",
		"-gossip-bind", gossipAddr, "-gossip-profile", "fast", "orders")
	sync.waitLog(t, "following", gossipAddr)

	backend := testpub.Backend(t, "gossiping")
	p := testpub.New(t, ns.Connect(t), publisher.Config{Gossip: &gossip.Config{
		BindAddr: "127.0.0.1:0", Join: []string{gossipAddr}, Profile: gossip.ProfileFast}})
	host, port, _ := net.SplitHostPort(backend.Listener.Addr().String())
	portN, _ := strconv.Atoi(port)
	if err := p.Announce(t.Context(), serverlist.Instance{Service: "orders", InstanceID: "gossiping", Host: host, Port: portN,
		Incarnation: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	name := defaultNamePrefix + "gossiping"
	h.waitServers(t, "orders", "the instance added", func(s map[string]*haServer) bool { return s[name] != nil })

	backend.Listener.Close()
	_ = p.Close() // no leave: gossip's failure detection finds the node gone
	h.waitServers(t, "orders", "the crashed instance deleted", func(s map[string]*haServer) bool { return s[name] == nil })
	sync.waitLog(t, "server deleted", `"crash":true`)
}
