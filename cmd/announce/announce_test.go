package main

import (
	"maps"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

func TestHoldMode(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	before := time.Now().UnixNano()
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr,
		"-zone", "z1", "-weight", "300", "-meta", "version=1.2", "-meta", "team=core=x", "-secure", "-log-level", "debug")

	// Nothing is announced while the address refuses connections: once
	// announce found it not ready, no event came and nothing is registered.
	a.WaitFor(t, "not ready yet", lineTimeout)
	w.quiet(t)
	if _, ok := w.get(t, "orders", id); ok {
		t.Fatal("registered before the address was ready")
	}
	backend := start(t, backendBin, "-addr", addr, "-name", "b1")
	backend.WaitFor(t, "listening on", lineTimeout)

	// The online event came once the backend accepted connections: it
	// answers. (The times the test read the event and the backend's line
	// do not order them: each came its own way.)
	on := w.next(t)
	expectKind(t, on, events.Online, id)
	if code, _ := testutil.Get(t, "http://"+addr+"/"); code != 200 {
		t.Fatalf("the backend answers %d after the online event", code)
	}
	if on.Incarnation < before || on.Incarnation > time.Now().UnixNano() {
		t.Fatalf("incarnation %d is not the start time of announce", on.Incarnation)
	}
	in, ok := w.get(t, "orders", id)
	want := serverlist.Instance{Service: "orders", InstanceID: id, Host: "127.0.0.1", Port: portOf(t, addr),
		Secure: true, Zone: "z1", Weight: 300, Metadata: map[string]string{"version": "1.2", "team": "core=x"}, Incarnation: on.Incarnation,
		Owner: in.Owner, // a random token of the process, checked below
		// announce's NATS connection, as the server names it (checked below)
		NATSServerID: in.NATSServerID, NATSClientID: in.NATSClientID}
	if !ok || !in.Equal(want) || len(in.Owner) < 16 || in.Connection().IsZero() {
		t.Fatalf("registry entry %+v (present %v), want %+v", in, ok, want)
	}

	a.Signal(t, syscall.SIGTERM)
	off := w.next(t)
	expectKind(t, off, events.Offline, id)
	if off.Incarnation != on.Incarnation || off.Reason != "shutdown" {
		t.Fatalf("offline event %+v", off.Event)
	}
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	if _, ok := w.get(t, "orders", id); ok {
		t.Fatal("still registered after SIGTERM")
	}
	if code, _ := testutil.Get(t, "http://"+addr+"/"); code != 200 {
		t.Fatal("hold mode must not touch the backend")
	}
}

func TestHoldModeHealthURLAndCustomID(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	start(t, backendBin, "-addr", addr).WaitFor(t, "listening on", lineTimeout)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-id", "pod/orders-7 blue",
		"-health", "http://"+addr+"/health")
	expectKind(t, w.next(t), events.Online, "pod/orders-7 blue")
	a.Signal(t, syscall.SIGINT)
	expectKind(t, w.next(t), events.Offline, "pod/orders-7 blue")
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
}

func TestSuperviseModeWithdrawsBeforeSignallingTheChild(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	// A drain far longer than the test: the checks below run inside it
	// whatever the machine's load, and a second signal cuts it short.
	const drain = 10 * time.Minute
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-drain", drain.String(),
		"--", backendBin, "-addr", addr, "-name", "s1", "-delay", "200ms", "-exit-code", "5")

	// The online event came once the command listened: it answers. (The
	// times the test read the event and the command's line do not order
	// them: each came its own way.)
	on := w.next(t)
	expectKind(t, on, events.Online, id)
	if code, _ := testutil.Get(t, "http://"+addr+"/"); code != 200 {
		t.Fatalf("the command answers %d after the online event", code)
	}
	// The child's stdout passes through announce's.
	a.WaitFor(t, "testbackend s1 listening on", lineTimeout)
	if _, ok := w.get(t, "orders", id); !ok {
		t.Fatal("not registered")
	}

	a.Signal(t, syscall.SIGTERM)
	off := w.next(t)
	expectKind(t, off, events.Offline, id)
	// Withdrawn, and draining: the command has not been signalled yet, it
	// still serves and has not said it received anything.
	if code, body := testutil.Get(t, "http://"+addr+"/x"); code != 200 || body != "s1 /x\n" {
		t.Fatalf("command not serving during the drain: %d %q", code, body)
	}
	noLine(t, a, "received")
	// A second signal ends the drain: the command gets its SIGTERM now.
	cut := time.Now()
	a.Signal(t, syscall.SIGTERM)
	if got := a.WaitFor(t, "testbackend s1 received terminated", lineTimeout); got.At.Before(cut) {
		t.Fatalf("the command got SIGTERM at %v, before the drain was cut at %v", got.At, cut)
	}
	if code := a.Wait(t, exitTimeout); code != 5 {
		t.Fatalf("exit status %d, want the command's 5", code)
	}
	if _, ok := w.get(t, "orders", id); ok {
		t.Fatal("still registered")
	}
}

func TestSuperviseModeCommandExitsOnItsOwn(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr,
		"--", backendBin, "-addr", addr, "-exit-after", "500ms", "-exit-code", "3")
	on := w.next(t)
	expectKind(t, on, events.Online, id)
	off := w.next(t)
	expectKind(t, off, events.Offline, id)
	if off.Incarnation != on.Incarnation || off.Reason != "exited" {
		t.Fatalf("offline event %+v", off.Event)
	}
	if code := a.Wait(t, exitTimeout); code != 3 {
		t.Fatalf("exit status %d, want 3", code)
	}
	if _, ok := w.get(t, "orders", id); ok {
		t.Fatal("still registered")
	}
}

func TestSuperviseModeCommandFailsBeforeReady(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for _, tc := range []struct {
		name    string
		command []string
		status  int
	}{
		{"exit 7", []string{"/bin/sh", "-c", "exit 7"}, 7},
		{"killed by SIGKILL", []string{"/bin/sh", "-c", "kill -KILL $$"}, 128 + 9},
		{"not found", []string{"/nonexistent/command"}, 127},
	} {
		args := append([]string{"-nats", w.srv.URL(), "-service", "orders", "-addr", testutil.FreeAddr(t), "--"}, tc.command...)
		if code := announce(t, args...).Wait(t, exitTimeout); code != tc.status {
			t.Errorf("%s: exit status %d, want %d", tc.name, code, tc.status)
		}
	}
	w.quiet(t)
}

func TestSuperviseModeNotReadyStopsTheCommand(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-ready-timeout", "300ms",
		"--", backendBin, "-addr", addr, "-name", "slow", "-delay", "10s")
	if code := a.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	a.WaitFor(t, "testbackend slow received terminated", lineTimeout)
	if !strings.Contains(a.Stderr(), "not ready within 300ms") {
		t.Fatalf("stderr does not explain: %s", a.Stderr())
	}
	w.quiet(t)
}

func TestOfflineMode(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	in := serverlist.Instance{Service: "orders", InstanceID: "10.0.0.9:orders:8080", Host: "10.0.0.9", Port: 8080, Incarnation: 12345}
	if _, err := w.reg.Register(testCtx(t), in); err != nil {
		t.Fatal(err)
	}
	if code := announce(t, "offline", "-nats", w.srv.URL(), "-service", "orders", "-id", in.InstanceID).Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	off := w.next(t)
	expectKind(t, off, events.Offline, in.InstanceID)
	if off.Incarnation != 12345 || off.Reason != "manual" {
		t.Fatalf("offline event %+v, want the registry's incarnation 12345", off.Event)
	}
	if _, ok := w.get(t, "orders", in.InstanceID); ok {
		t.Fatal("still registered")
	}
	st, err := w.reg.KeyValue().Status(testCtx(t))
	if err != nil || st.TTL() != serverlist.DefaultTTL {
		t.Fatalf("offline mode changed the bucket: %v, %v", st, err)
	}

	// Not registered: the current time, or -incarnation.
	before := time.Now().UnixNano()
	if code := announce(t, "offline", "-nats", w.srv.URL(), "-service", "orders", "-id", "gone", "-reason", "host died").Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	off = w.next(t)
	expectKind(t, off, events.Offline, "gone")
	if off.Incarnation < before || off.Incarnation > time.Now().UnixNano() || off.Reason != "host died" {
		t.Fatalf("offline event %+v, want the current time as incarnation", off.Event)
	}
	if code := announce(t, "offline", "-nats", w.srv.URL(), "-service", "orders", "-id", "gone", "-incarnation", "77").Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	if off = w.next(t); off.Incarnation != 77 {
		t.Fatalf("offline event %+v, want -incarnation 77", off.Event)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-addr", "127.0.0.1:9001"}, "-service is required"},
		{[]string{"-service", "orders"}, "-addr is required"},
		{[]string{"-service", "or.ders", "-addr", "127.0.0.1:9001"}, "-service \"or.ders\""},
		{[]string{"-service", "orders", "-addr", "localhost"}, "-addr \"localhost\""},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:99999"}, "port \"99999\""},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-meta", "novalue"}, "want key=value"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-meta", "a=1", "-meta", "a=2"}, "given twice"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-gossip", "10.0.0.1:7946", "-gossip-key", "short"}, "gossip key"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-gossip-bind", ":7946", "-gossip-profile", "warp"}, "Profile"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-log-level", "loud"}, "-log-level"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-lease", "100ms"}, "-lease"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-registry-replicas", "6"}, "-registry-replicas 6"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-user", "u", "-token", "t"}, "-user and -token"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-tls-cert", "c.pem"}, "-tls-cert and -tls-key"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "./server"}, "after --"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "--"}, "no command after --"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-nope"}, "flag provided but not defined: -nope"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-weight", "0"}, "-weight 0: 1 to 1000"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-weight", "1001"}, "-weight 1001: 1 to 1000"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-weight", "heavy"}, "-weight"},
		{[]string{"offline", "-service", "orders"}, "-id is required"},
		{[]string{"-service", "orders", "offline"}, "offline must come first"},
	} {
		a := announce(t, tc.args...)
		code := a.Wait(t, exitTimeout)
		stderr := a.Stderr()
		if code != 2 || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "usage:") {
			t.Errorf("announce %s: exit status %d, stderr:\n%s\nwant 2 and %q with the usage", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	a := announce(t, "-h")
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	for _, want := range append(append([]string{"Examples:", "announce offline", "-- COMMAND"}, instanceFlags...), commonFlags...) {
		if !strings.Contains(a.Stdout(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestNATSUnreachable(t *testing.T) {
	t.Parallel()
	url := "nats://" + testutil.FreeAddr(t)
	a := announce(t, "-nats", url, "-nats-timeout", "300ms", "-service", "orders", "-addr", "127.0.0.1:9001")
	if code := a.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	// "after 300ms": the error of a wait that -nats-timeout ended (the
	// default is 10 s); it says what to do, too.
	for _, want := range []string{"cannot reach NATS at " + url + " after 300ms", "start a gateway", "pass -nats"} {
		if !strings.Contains(a.Stderr(), want) {
			t.Fatalf("stderr %q lacks %q", a.Stderr(), want)
		}
	}
	// Supervise mode does not start the command then.
	a = announce(t, "-nats", url, "-nats-timeout", "300ms", "-service", "orders", "-addr", "127.0.0.1:9001",
		"--", "/bin/sh", "-c", "echo started")
	if code := a.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("supervise: exit status %d, want 1", code)
	}
	noLine(t, a, "started")
}

func TestHoldModeNotReady(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-ready-timeout", "300ms")
	if code := a.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	if want := addr + " not ready within 300ms"; !strings.Contains(a.Stderr(), want) {
		t.Fatalf("stderr %q lacks %q", a.Stderr(), want)
	}
	w.quiet(t)
	list, err := w.reg.List(testCtx(t), "orders")
	if err != nil || len(list) != 0 {
		t.Fatalf("registry %v, %v", list, err)
	}
}

func TestHoldModeStartedBeforeNATS(t *testing.T) {
	t.Parallel()
	backend := testutil.FreeAddr(t)
	start(t, backendBin, "-addr", backend).WaitFor(t, "listening on", lineTimeout)
	natsAddr := testutil.FreeAddr(t)
	a := announce(t, "-nats", "nats://"+natsAddr, "-service", "orders", "-addr", backend, "-log-level", "debug")
	a.WaitFor(t, "NATS not reachable yet", lineTimeout) // it tried, and retries
	w := newWorldOn(t, portOf(t, natsAddr))
	expectKind(t, w.next(t), events.Online, "127.0.0.1:orders:"+strconv.Itoa(portOf(t, backend)))
	a.Signal(t, syscall.SIGTERM)
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
}

// Default IDs follow Eureka's host:service:port; a wildcard host registers
// the host name. Checked on the parsed configuration.
func TestDefaultInstance(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	if err != nil {
		testutil.Missing(t, "no host name: %v", err)
	}
	for _, tc := range []struct {
		addr, id, host, dial string
	}{
		{"10.0.0.5:8080", "10.0.0.5:orders:8080", "10.0.0.5", "10.0.0.5:8080"},
		{":8080", host + ":orders:8080", host, "127.0.0.1:8080"},
		{"0.0.0.0:8080", host + ":orders:8080", host, "127.0.0.1:8080"},
		{"[::]:8080", host + ":orders:8080", host, "127.0.0.1:8080"},
		{"[::1]:8080", "::1:orders:8080", "::1", "[::1]:8080"},
	} {
		cfg, err := parseArgs([]string{"-service", "orders", "-addr", tc.addr, "-meta", "k=v"}, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		in := cfg.instance
		if in.InstanceID != tc.id || in.Host != tc.host || in.Port != 8080 || cfg.dialAddr != tc.dial ||
			!maps.Equal(in.Metadata, map[string]string{"k": "v"}) || cfg.mode != modeHold || in.Weight != 0 {
			t.Errorf("%s: %+v dial %s", tc.addr, in, cfg.dialAddr)
		}
	}
}

func TestSuperviseModeSecondSignalCutsTheDrain(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-drain", "1m",
		"--", backendBin, "-addr", addr, "-name", "s2")
	expectKind(t, w.next(t), events.Online, "127.0.0.1:orders:"+strconv.Itoa(portOf(t, addr)))
	a.Signal(t, syscall.SIGTERM)
	w.next(t) // offline
	a.Signal(t, syscall.SIGINT)
	a.WaitFor(t, "testbackend s2 received interrupt", lineTimeout) // the second signal is the one forwarded
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
}

// TestSuperviseModeDrainsBeforeSignalling: left alone, the drain runs its
// whole length: the command's SIGTERM comes at least -drain after
// announce's (a lower bound the drain's timer guarantees).
func TestSuperviseModeDrainsBeforeSignalling(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	const drain = 300 * time.Millisecond
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-drain", drain.String(),
		"--", backendBin, "-addr", addr, "-name", "s3")
	expectKind(t, w.next(t), events.Online, "127.0.0.1:orders:"+strconv.Itoa(portOf(t, addr)))
	signalled := time.Now()
	a.Signal(t, syscall.SIGTERM)
	got := a.WaitFor(t, "testbackend s3 received terminated", lineTimeout)
	if gap := got.At.Sub(signalled); gap < drain {
		t.Fatalf("the command got SIGTERM %v after announce's, before -drain %v ended", gap, drain)
	}
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
}

func TestSuperviseModeForwardsSIGHUP(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr,
		"--", backendBin, "-addr", addr)
	expectKind(t, w.next(t), events.Online, "127.0.0.1:orders:"+strconv.Itoa(portOf(t, addr)))
	// testbackend does not handle SIGHUP, so it dies of it: announce
	// withdraws at once and reports 128+1, as a shell would.
	a.Signal(t, syscall.SIGHUP)
	if off := w.next(t); off.Kind != events.Offline || off.Reason != "exited" {
		t.Fatalf("got %+v", off.Event)
	}
	if code := a.Wait(t, exitTimeout); code != 128+int(syscall.SIGHUP) {
		t.Fatalf("exit status %d, want %d", code, 128+int(syscall.SIGHUP))
	}
}

func TestStopSignalBeforeReady(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	// Supervise: the signal goes straight to the command, whose status
	// announce returns; nothing is announced.
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr,
		"--", backendBin, "-addr", addr, "-name", "early", "-delay", "1m", "-exit-code", "6")
	// The command prints this once it handles signals; announce, which
	// started it, handled them before it connected.
	a.WaitFor(t, "testbackend early waiting 1m0s before listening", lineTimeout)
	a.Signal(t, syscall.SIGTERM)
	a.WaitFor(t, "testbackend early received terminated", lineTimeout)
	if code := a.Wait(t, exitTimeout); code != 6 {
		t.Fatalf("supervise: exit status %d, want 6", code)
	}
	// Hold: nothing to undo, exit 0.
	h := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr)
	h.WaitFor(t, "waiting for the instance to be ready", lineTimeout) // logged after signal.Notify
	h.Signal(t, syscall.SIGINT)
	if code := h.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("hold: exit status %d, want 0", code)
	}
	w.quiet(t)
}
