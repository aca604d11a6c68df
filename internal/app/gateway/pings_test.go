package gateway

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/cli/natsconn"
)

// The gateway's connection pings as the flags (or the file) say: every
// 5 s by default, a sixth of a shorter lease, or -nats-ping-interval; 2
// pings outstanding at most.
func TestGatewayPings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, natsconn.DefaultPingInterval},
		{[]string{"-lease", "12s"}, 2 * time.Second},
		{[]string{"-nats-ping-interval", "250ms"}, 250 * time.Millisecond},
	} {
		cfg := testConfig(t)
		fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.RegisterFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		g := startGateway(t, cfg)
		if got, out := g.nc.Opts.PingInterval, g.nc.Opts.MaxPingsOut; got != tc.want || out != natsconn.MaxPingsOut {
			t.Errorf("%q: the connection pings every %v with %d outstanding, want %v and %d", tc.args, got, out, tc.want, natsconn.MaxPingsOut)
		}
		g.Shutdown(t.Context())
	}

	path := filepath.Join(t.TempDir(), "gw.yaml")
	os.WriteFile(path, []byte("nats: {pingInterval: 2s}\n"), 0o600)
	cfg, err := LoadFile(path)
	if err != nil || cfg.NATS.PingInterval != 2*time.Second {
		t.Fatalf("nats.pingInterval: %v, %v; want 2s", cfg.NATS.PingInterval, err)
	}
}

// A ping interval that is not positive, or too long for the lease given,
// is a configuration error, in the file and on the command line.
func TestGatewayPingErrors(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"nats:\n  pingInterval: -1s\n":             "bad.yaml:2: nats.pingInterval: -1s is negative",
		"lease: 10s\nnats:\n  pingInterval: 3s\n":  "bad.yaml:3: nats.pingInterval: 3s: 2 unanswered pings (6s) are not below half of lease 10s (5s): a paused server or a dead link would be noticed too late; give less than 2.5s",
		"lease: 10s\nnats:\n  pingInterval: 2s\n":  "",
		"nats:\n  pingInterval: 1m\n":              "", // the bucket's lease: Start warns if it is too short
		"lease: 10ms\nnats:\n  pingInterval: 1m\n": "bad.yaml:1: lease: 10ms is below the minimum 1s (0: the bucket's)",
	} {
		path := filepath.Join(dir, "bad.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		_, err := LoadFile(path)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", body, err)
		case want != "" && (!errors.Is(err, ErrConfig) || !errors.Is(err, natsconn.ErrInvalidConfig) && strings.Contains(want, "nats.") ||
			err.Error() != "gateway: invalid config: "+path+":"+strings.TrimPrefix(want, "bad.yaml:")):
			t.Errorf("%q:\n got  %v\n want %s", body, err, want)
		}
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-lease", "10s", "-nats-ping-interval", "3s"}, "gateway: invalid config: -nats-ping-interval 3s: 2 unanswered pings (6s) are not below half of -lease 10s (5s)"},
		{[]string{"-nats-ping-interval", "0"}, `invalid value "0" for flag -nats-ping-interval: 0s is not positive`},
		{[]string{"-nats-ping-interval", "-2s"}, `invalid value "-2s" for flag -nats-ping-interval: -2s is not positive`},
	} {
		cfg := DefaultConfig()
		fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.RegisterFlags(fs)
		err := fs.Parse(tc.args)
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s...", tc.args, err, tc.want)
		}
	}
}
