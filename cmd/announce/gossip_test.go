package main

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestGossipSettingsCheckedWithGossipOff: an invalid profile or key is a
// usage error even when gossip is off.
func TestGossipSettingsCheckedWithGossipOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-gossip-profile", "warp"}, "Profile"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-gossip-key", "short"}, "gossip key"},
		{[]string{"-service", "orders", "-addr", "127.0.0.1:9001", "-gossip-key", "c2hvcnQ="}, "SecretKey"},
	} {
		_, err := parseArgs(tc.args, io.Discard)
		var uerr *usageError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &uerr) {
			t.Errorf("announce %s: %v, want a usage error naming %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// TestGossipSettingsWithGossipOffWarn: gossip settings given without
// -gossip or -gossip-bind have no effect, and announce says so at start.
func TestGossipSettingsWithGossipOffWarn(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", testutil.FreeAddr(t),
		"-gossip-profile", "fast", "-gossip-key", "MDEyMzQ1Njc4OWFiY2RlZg==")
	l := a.WaitFor(t, "gossip is off", lineTimeout)
	for _, want := range []string{`"level":"warn"`, "-gossip-profile (gossip.profile)", "-gossip-key (gossip.key)"} {
		if !strings.Contains(l.Text, want) {
			t.Errorf("warning %s lacks %q", l.Text, want)
		}
	}
}

// TestGossipMemberLoggedOnce: the gossip address is logged once, by the
// announcement that joins, not again by announce itself.
func TestGossipMemberLoggedOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr := testutil.FreeAddr(t)
	start(t, backendBin, "-addr", addr).WaitFor(t, "listening on", lineTimeout)
	a := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-addr", addr, "-gossip-bind", "127.0.0.1:0")
	expectKind(t, w.next(t), events.Online, "127.0.0.1:orders:"+strconv.Itoa(portOf(t, addr)))
	a.Signal(t, syscall.SIGTERM)
	if code := a.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	if n := strings.Count(a.Output(), `"message":"gossip member"`); n != 1 {
		t.Fatalf("%d \"gossip member\" lines, want 1:\n%s", n, a.Output())
	}
}
