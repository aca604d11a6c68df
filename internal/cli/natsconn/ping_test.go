package natsconn_test

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// The connection Connect makes pings as configured: every 5 s by default
// (nats.go's own default is 2 min), 2 outstanding at most.
func TestConnectSetsThePings(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	for _, tc := range []struct {
		cfg  natsconn.Config
		want time.Duration
	}{
		{natsconn.Config{URL: srv.URL()}, natsconn.DefaultPingInterval},
		{natsconn.Config{URL: srv.URL(), PingInterval: 300 * time.Millisecond}, 300 * time.Millisecond},
	} {
		nc, err := natsconn.Connect(t.Context(), tc.cfg, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		got, out := nc.Opts.PingInterval, nc.Opts.MaxPingsOut
		nc.Close()
		if got != tc.want || out != natsconn.MaxPingsOut {
			t.Errorf("PingInterval %v: the connection pings every %v with %d outstanding, want %v and %d", tc.cfg.PingInterval, got, out, tc.want, natsconn.MaxPingsOut)
		}
	}
	if natsconn.DefaultPingInterval*natsconn.MaxPingsOut >= 30*time.Second/2 {
		t.Errorf("the default pings (%v x %d) do not notice a dead link within half the default lease", natsconn.DefaultPingInterval, natsconn.MaxPingsOut)
	}
}

// -nats-ping-interval refuses 0 (which would turn the pings off) and
// negative values at parse time.
func TestPingIntervalFlag(t *testing.T) {
	for arg, want := range map[string]string{
		"0":     "0s is not positive",
		"-1s":   "-1s is not positive",
		"soon":  "parse error",
		"250ms": "",
	} {
		var c natsconn.Config
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		err := fs.Parse([]string{"-nats-ping-interval", arg})
		switch {
		case want == "" && (err != nil || c.PingInterval != 250*time.Millisecond):
			t.Errorf("-nats-ping-interval %s: %v, interval %v", arg, err, c.PingInterval)
		case want != "" && (err == nil || !strings.Contains(err.Error(), "-nats-ping-interval: "+want)):
			t.Errorf("-nats-ping-interval %s: %v, want an error saying %q", arg, err, want)
		}
	}
	var out strings.Builder
	var c natsconn.Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(&out)
	c.RegisterFlags(fs)
	fs.PrintDefaults()
	if !strings.Contains(out.String(), "-nats-ping-interval D") || !strings.Contains(out.String(), "(default 5s, or a sixth of -lease when shorter)") {
		t.Errorf("-h does not show the flag with its default:\n%s", out.String())
	}
}

// ForLease fits a ping interval left zero to a lease shorter than 25 s,
// so that its 2 pings stay below half of it; a value given, or no lease,
// is kept.
func TestForLease(t *testing.T) {
	for _, tc := range []struct {
		interval, lease, want time.Duration
	}{
		{0, 0, 0}, // Connect's default, 5 s
		{0, 30 * time.Second, 5 * time.Second},
		{0, time.Hour, 5 * time.Second},
		{0, 12 * time.Second, 2 * time.Second},
		{0, 1200 * time.Millisecond, 200 * time.Millisecond},
		{7 * time.Second, 10 * time.Second, 7 * time.Second}, // ValidateLease's to refuse
		{time.Second, 30 * time.Second, time.Second},
	} {
		c := natsconn.Config{PingInterval: tc.interval}.ForLease(tc.lease)
		if c.PingInterval != tc.want {
			t.Errorf("interval %v, lease %v: %v, want %v", tc.interval, tc.lease, c.PingInterval, tc.want)
		}
		if tc.interval == 0 && tc.lease > 0 && c.ValidateLease(tc.lease) != nil {
			t.Errorf("lease %v: the fitted interval %v is refused: %v", tc.lease, c.PingInterval, c.ValidateLease(tc.lease))
		}
	}
}

// Refit fits the default pings to a bucket's lease read once connected
// only when they are too slow for it and no interval was given.
func TestRefit(t *testing.T) {
	for _, tc := range []struct {
		interval, ttl, want time.Duration
		ok                  bool
	}{
		{0, 30 * time.Second, 0, false}, // 5 s x 2 fit
		{0, 0, 0, false},                // unknown
		{0, 6 * time.Second, time.Second, true},
		{0, 24 * time.Second, 4 * time.Second, true},
		{3 * time.Second, 6 * time.Second, 3 * time.Second, false}, // given: the user's
	} {
		c, ok := natsconn.Config{PingInterval: tc.interval}.Refit(tc.ttl)
		if ok != tc.ok || c.PingInterval != tc.want {
			t.Errorf("interval %v, bucket lease %v: %v, %v; want %v, %v", tc.interval, tc.ttl, c.PingInterval, ok, tc.want, tc.ok)
		}
	}
}

// ValidateLease refuses an interval given whose MaxPingsOut pings are not
// below half the lease, by key and by flag, and checks nothing without a
// lease.
func TestValidateLease(t *testing.T) {
	for _, tc := range []struct {
		interval, lease time.Duration
		ok              bool
	}{
		{0, 30 * time.Second, true}, // not given: ForLease fits it
		{0, time.Second, true},
		{5 * time.Second, 30 * time.Second, true}, // the default: 10 s < 15 s
		{7 * time.Second, 30 * time.Second, true},
		{7500 * time.Millisecond, 30 * time.Second, false},
		{time.Minute, 30 * time.Second, false},
		{5 * time.Second, 20 * time.Second, false}, // the default given for a 20 s lease
		{time.Hour, 0, true},                       // the bucket's lease: checked at run time
		{200 * time.Millisecond, time.Second, true},
		{-time.Second, 30 * time.Second, true}, // Validate's to report
	} {
		err := natsconn.Config{PingInterval: tc.interval}.ValidateLease(tc.lease)
		if tc.ok != (err == nil) {
			t.Errorf("interval %v, lease %v: %v, want ok %v", tc.interval, tc.lease, err, tc.ok)
		}
	}
	err := natsconn.Config{PingInterval: 10 * time.Second}.ValidateLease(30 * time.Second)
	var ps natsconn.Problems
	if !errors.As(err, &ps) || !errors.Is(err, natsconn.ErrInvalidConfig) || len(ps) != 1 {
		t.Fatalf("ValidateLease = %v, want one Problem wrapping ErrInvalidConfig", err)
	}
	detail := "2 unanswered pings (20s) are not below half of %s30s (15s): a paused server or a dead link would be noticed too late; give less than 7.5s"
	want := natsconn.Problem{
		Key:     "pingInterval",
		Msg:     "10s: " + strings.Replace(detail, "%s", "lease ", 1),
		FlagMsg: "-nats-ping-interval 10s: " + strings.Replace(detail, "%s", "-lease ", 1),
	}
	if ps[0] != want {
		t.Errorf("problem\n got %q\nwant %q", ps[0], want)
	}
}

// A dead link, the connection open but nothing getting through (a paused
// server looks the same), is noticed by the pings: the client declares
// the connection stale, says so, and reconnects.
func TestPingsNoticeADeadLink(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	link := natstest.NewLink(t, strings.TrimPrefix(srv.URL(), "nats://"))
	var logs testutil.SyncBuffer
	const interval = 100 * time.Millisecond
	nc, err := natsconn.Connect(t.Context(), natsconn.Config{URL: link.URL(), PingInterval: interval, ReconnectWait: 20 * time.Millisecond}, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if n := link.Freeze(); n != 1 {
		t.Fatalf("froze %d connections, want 1", n)
	}
	frozen := time.Now()
	// The disconnect callback's log line is the signal; the bound is far
	// beyond the 3 intervals it takes, and far below nats.go's default.
	testutil.EventuallyWithin(t, 10*time.Second, "the dead link to be noticed", func() bool {
		return strings.Contains(logs.String(), "disconnected from NATS")
	})
	took := time.Since(frozen)
	if !strings.Contains(logs.String(), "stale connection") {
		t.Errorf("the disconnect was not the pings' (stale connection):\n%s", logs.String())
	}
	testutil.Eventually(t, "the reconnect through a new link", func() bool {
		return strings.Contains(logs.String(), "reconnected to NATS") && nc.IsConnected()
	})
	if err := nc.Flush(); err != nil {
		t.Fatalf("the new connection does not answer: %v", err)
	}
	t.Logf("dead link noticed %v after the freeze (pings every %v, %d outstanding)", took, interval, natsconn.MaxPingsOut)
}
