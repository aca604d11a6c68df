package main

import (
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/serverlist"
)

// The connection announce makes pings as its command line says: every
// 5 s by default, a sixth of a shorter -lease, or -nats-ping-interval; 2
// pings outstanding at most.
func TestPingIntervalReachesTheConnection(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, natsconn.DefaultPingInterval},
		{[]string{"-lease", "12s"}, 2 * time.Second},
		{[]string{"-nats-ping-interval", "300ms"}, 300 * time.Millisecond},
		{[]string{"-lease", "10s", "-nats-ping-interval", "1s"}, time.Second},
	} {
		args := append([]string{"-nats", srv.URL(), "-service", "orders", "-addr", "127.0.0.1:9001"}, tc.args...)
		cfg, err := parseArgs(args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		nc, err := natsconn.Connect(t.Context(), cfg.nats, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		got, out := nc.Opts.PingInterval, nc.Opts.MaxPingsOut
		nc.Close()
		if got != tc.want || out != natsconn.MaxPingsOut {
			t.Errorf("%q: the connection pings every %v with %d outstanding, want %v and %d", tc.args, got, out, tc.want, natsconn.MaxPingsOut)
		}
	}
}

// A ping interval that is not positive, or too long for -lease, is a
// usage error.
func TestPingIntervalUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-nats-ping-interval", "0"}, `invalid value "0" for flag -nats-ping-interval: 0s is not positive`},
		{[]string{"-nats-ping-interval", "-1s"}, `invalid value "-1s" for flag -nats-ping-interval: -1s is not positive`},
		{[]string{"-lease", "10s", "-nats-ping-interval", "3s"}, "-nats-ping-interval 3s: 2 unanswered pings (6s) are not below half of -lease 10s (5s): a paused server or a dead link would be noticed too late; give less than 2.5s"},
		{[]string{"-lease", "30s", "-nats-ping-interval", "8s"}, "-nats-ping-interval 8s: 2 unanswered pings (16s) are not below half of -lease 30s (15s)"},
	} {
		a := announce(t, append([]string{"-service", "orders", "-addr", "127.0.0.1:9001"}, tc.args...)...)
		code := a.Wait(t, exitTimeout)
		if stderr := a.Stderr(); code != exitUsage || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "usage:") {
			t.Errorf("announce %s: exit status %d, stderr:\n%s\nwant 2 and %q with the usage", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
	}
}

// A dead link between announce and its NATS server (a paused server looks
// the same: the connection stays open, nothing gets through) is noticed
// by announce's pings: it says so, connects again and announces the
// instance again, long before the lease (30 s) ends.
func TestPingsNoticeADeadLink(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	link := natstest.NewLink(t, strings.TrimPrefix(w.srv.URL(), "nats://"))
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the instance: it accepts connections
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	a := announce(t, "-nats", link.URL(), "-nats-ping-interval", "100ms", "-service", "orders", "-addr", addr, "-health-interval", "0")
	expectKind(t, w.next(t), events.Online, id)

	if n := link.Freeze(); n != 1 {
		t.Fatalf("froze %d connections, want announce's 1", n)
	}
	// The bound, 5 s, is 3 intervals many times over, and below the 10 s
	// that the default interval (5 s) takes at least.
	l := a.WaitFor(t, "disconnected from NATS", lineTimeout)
	if !strings.Contains(l.Text, "stale connection") {
		t.Errorf("the disconnect was not the pings' (stale connection): %s", l.Text)
	}
	a.WaitFor(t, "reconnected to NATS", lineTimeout)
	// After the reconnect the instance is announced again: its registry
	// entry and lease renewed through the new connection.
	expectKind(t, w.next(t), events.Online, id)

	a.Signal(t, syscall.SIGTERM)
	expectKind(t, w.next(t), events.Offline, id)
	if code := a.Wait(t, exitTimeout); code != exitOK {
		t.Fatalf("exit status %d, stderr:\n%s", code, a.Stderr())
	}
}

// Without -lease announce takes the bucket's, known once connected: a
// bucket whose lease is short for the default pings makes it connect
// again with pings fitted to it, before it announces anything.
func TestPingsFittedToTheBucketsLease(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{TTL: 6 * time.Second}); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseArgs([]string{"-nats", srv.URL(), "-service", "orders", "-addr", "127.0.0.1:9001"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{cfg: cfg, log: zerolog.Nop(), libLog: zerolog.Nop()}
	s, err := a.connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if got := s.nc.Opts.PingInterval; got != time.Second {
		t.Fatalf("the connection pings every %v under a 6 s lease, want 1s", got)
	}
}
