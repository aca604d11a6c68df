package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
)

// healthBackend is a real HTTP backend whose /health answers 200 while
// healthy is set and 503 otherwise.
func healthBackend(t *testing.T) (*httptest.Server, *atomic.Bool) {
	t.Helper()
	var healthy atomic.Bool
	healthy.Store(true)
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			http.Error(w, "failing", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	t.Cleanup(b.Close)
	return b, &healthy
}

// gatewayClient is a started pushlb.Client over the world's NATS server (a
// gateway's embedding: events, registry lookups, balancers) whose lists of
// "orders" arrive on the returned channel, the current one first.
func gatewayClient(t *testing.T, w *world) chan []string {
	t.Helper()
	c, err := pushlb.New(w.srv.Connect(t), pushlb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	lists := make(chan []string, 64)
	stop := c.Watch("orders", func(servers []*balancer.Server) {
		ids := make([]string, 0, len(servers))
		for _, s := range servers {
			ids = append(ids, s.ID)
		}
		lists <- ids
	})
	t.Cleanup(stop)
	return lists
}

// untilListed reads lists until one holds id (listed true) or lacks it.
func untilListed(t *testing.T, lists chan []string, id string, listed bool, what string) {
	t.Helper()
	for {
		if l := testutil.Receive(t, lists, 10*time.Second, what); slices.Contains(l, id) == listed {
			return
		}
	}
}

// TestHealthGatedAnnouncement: announce (a real process) keeps checking a
// backend's health URL after announcing it. When the URL starts failing,
// the third failed check in a row announces the instance offline: the
// gateway drops it, the registry no longer holds it, and announce and the
// backend live on. When the URL passes again, the instance is announced
// online with the same incarnation and the gateway routes it again.
func TestHealthGatedAnnouncement(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	lists := gatewayClient(t, w)
	backend, healthy := healthBackend(t)
	addr := strings.TrimPrefix(backend.URL, "http://")
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr,
		"-health", backend.URL+"/health", "-health-interval", "50ms", "-health-failures", "3")

	on := w.next(t)
	expectKind(t, on, events.Online, id)
	untilListed(t, lists, id, true, "the instance listed")

	failing := time.Now()
	healthy.Store(false)
	off := w.next(t)
	expectKind(t, off, events.Offline, id)
	if off.Incarnation != on.Incarnation || !strings.HasPrefix(off.Reason, publisher.DownReasonPrefix+": ") || !strings.Contains(off.Reason, "503") {
		t.Fatalf("offline event %+v", off.Event)
	}
	untilListed(t, lists, id, false, "the instance dropped")
	t.Logf("dropped by the gateway %v after the health URL began failing (3 checks at 50 ms), %v after the offline event reached the test",
		time.Since(failing).Round(time.Millisecond), time.Since(off.at).Round(time.Microsecond))
	// Exactly three failures came before the offline: the log (one stream,
	// in order) says so, each line written before the next step.
	a.WaitFor(t, "announced offline (down)", lineTimeout)
	var failed []string
	for _, l := range a.Lines() {
		if strings.Contains(l.Text, "announced offline (down)") {
			break
		}
		if strings.Contains(l.Text, `"message":"health check failed"`) {
			failed = append(failed, l.Text)
		}
	}
	if len(failed) != 3 || !strings.Contains(failed[2], `"failures":3`) {
		t.Fatalf("%d failed checks logged before the offline, want 3:\n%s", len(failed), strings.Join(failed, "\n"))
	}
	if _, ok := w.get(t, "orders", id); ok {
		t.Fatal("the record of a down instance is still in the registry")
	}
	select {
	case <-a.Done():
		t.Fatalf("announce exited while the instance is down:\n%s", a.Output())
	default:
	}

	passing := time.Now()
	healthy.Store(true)
	back := w.next(t)
	expectKind(t, back, events.Online, id)
	if back.Incarnation != on.Incarnation {
		t.Fatalf("incarnation %d after recovery, want the same life's %d", back.Incarnation, on.Incarnation)
	}
	untilListed(t, lists, id, true, "the instance listed again")
	t.Logf("listed again %v after the health URL passed again", time.Since(passing).Round(time.Millisecond))
	if in, ok := w.get(t, "orders", id); !ok || in.Incarnation != on.Incarnation {
		t.Fatalf("registry after recovery: %+v (present %v)", in, ok)
	}

	a.Signal(t, syscall.SIGTERM)
	off = w.next(t)
	expectKind(t, off, events.Offline, id)
	if off.Reason != "shutdown" {
		t.Fatalf("offline event %+v", off.Event)
	}
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	w.quiet(t)
}

// TestHealthGatedSupervise: in supervise mode the instance goes down and
// up with its health URL while the command runs on, and a stop signal
// while it is down withdraws nothing more: the command is signalled and
// its status returned.
func TestHealthGatedSupervise(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	health, healthy := healthBackend(t)
	addr := testutil.FreeAddr(t)
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-drain", "0s",
		"-health", health.URL+"/health", "-health-interval", "50ms", "-health-failures", "2",
		"--", backendBin, "-addr", addr, "-name", "s1", "-exit-code", "3")
	on := w.next(t)
	expectKind(t, on, events.Online, id)

	healthy.Store(false)
	off := w.next(t)
	expectKind(t, off, events.Offline, id)
	if !strings.HasPrefix(off.Reason, publisher.DownReasonPrefix) {
		t.Fatalf("offline event %+v", off.Event)
	}
	if code, body := testutil.Get(t, "http://"+addr+"/x"); code != 200 || body != "s1 /x\n" {
		t.Fatalf("the command does not serve while down: %d %q", code, body)
	}
	healthy.Store(true)
	expectKind(t, w.next(t), events.Online, id)
	healthy.Store(false)
	expectKind(t, w.next(t), events.Offline, id)

	a.Signal(t, syscall.SIGTERM)
	if code := a.Wait(t, exitTimeout); code != 3 {
		t.Fatalf("exit status %d, want the command's 3:\n%s", code, a.Output())
	}
	w.quiet(t) // no second offline for a down instance
	if _, ok := w.get(t, "orders", id); ok {
		t.Fatal("still registered")
	}
}

// TestHealthIntervalZeroChecksOnlyBeforeAnnouncing: -health-interval 0
// keeps the behaviour of old: no checks once announced.
func TestHealthIntervalZeroChecksOnlyBeforeAnnouncing(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	backend, _ := healthBackend(t)
	addr := strings.TrimPrefix(backend.URL, "http://")
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-health-interval", "0")
	expectKind(t, w.next(t), events.Online, "127.0.0.1:orders:"+strconv.Itoa(portOf(t, addr)))
	a.Signal(t, syscall.SIGTERM)
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	// With checks on, "checking health" is logged before announce reads
	// its next signal.
	if strings.Contains(a.Output(), "checking health") {
		t.Fatalf("health checked with -health-interval 0:\n%s", a.Output())
	}
}

// TestHealthFlags: defaults, values, and what is refused.
func TestHealthFlags(t *testing.T) {
	t.Parallel()
	base := []string{"-service", "orders", "-addr", "127.0.0.1:9001"}
	cfg, err := parseArgs(base, io.Discard)
	if err != nil || cfg.healthInterval != 5*time.Second || cfg.healthFailures != 3 {
		t.Fatalf("defaults: interval %v, failures %d, %v; want 5s and 3", cfg.healthInterval, cfg.healthFailures, err)
	}
	cfg, err = parseArgs(append(base, "-health-interval", "0", "-health-failures", "1"), io.Discard)
	if err != nil || cfg.healthInterval != 0 || cfg.healthFailures != 1 {
		t.Fatalf("interval %v, failures %d, %v; want 0 and 1", cfg.healthInterval, cfg.healthFailures, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-health-interval", "-1s"}, "-health-interval -1s is negative"},
		{[]string{"-health-failures", "0"}, "-health-failures 0: at least 1"},
		{[]string{"-health-failures", "-2"}, "-health-failures -2: at least 1"},
		{[]string{"-health-failures", "x"}, "-health-failures"},
		{[]string{"-health-interval", "5"}, "-health-interval"},
	} {
		_, err := parseArgs(append(slices.Clone(base), tc.args...), io.Discard)
		var uerr *usageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &uerr) {
			t.Errorf("announce %s: %v, want a usage error with %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	// Offline mode has no health flags.
	if _, err := parseArgs([]string{"offline", "-service", "orders", "-id", "x", "-health-interval", "1s"}, io.Discard); err == nil {
		t.Error("offline mode accepted -health-interval")
	}
}

// TestHealthHelp: the help explains the checks after the announcement.
func TestHealthHelp(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if _, err := parseArgs([]string{"-h"}, &out); err != errHelp {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"-health-interval D", "-health-failures N", "(default 5s)", "(default 3)", "unhealthy: ...", "same\nincarnation", "-health-interval 0 checks only before the announcement"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}
