package publisher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// New warns, once, when the connection's pings would notice a paused
// server or a dead link only after half the lease, and names the fix;
// a connection made with PingOptions is quiet under the default lease.
func TestNewWarnsOfSlowPings(t *testing.T) {
	r := newRig(t, serverlist.DefaultTTL)
	opts := publisher.PingOptions()
	for _, tc := range []struct {
		name string
		opts []nats.Option
		warn string // "" for none
	}{
		{"nats.go's default", nil, "(every 2m0s, 2 unanswered at most)"},
		{"PingOptions", opts, ""},
		{"pings off", []nats.Option{nats.PingInterval(0)}, "sends no pings"},
		{"7.5 s x 2", []nats.Option{nats.PingInterval(7500 * time.Millisecond), nats.MaxPingsOutstanding(2)}, "15s to 22.5s after it happens, not within half the registry lease (15s of 30s)"},
		{"5 s x 3", []nats.Option{nats.PingInterval(5 * time.Second), nats.MaxPingsOutstanding(3)}, "(every 5s, 3 unanswered at most)"},
		{"7 s x 2", []nats.Option{nats.PingInterval(7 * time.Second), nats.MaxPingsOutstanding(2)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := r.srv.Connect(t, tc.opts...)
			var logs testutil.SyncBuffer
			p, err := publisher.New(nc, r.reg, publisher.Config{Logger: zerolog.New(&logs)})
			if err != nil {
				t.Fatal(err)
			}
			p.Close()
			out := logs.String()
			if tc.warn == "" {
				if out != "" {
					t.Fatalf("unexpected log:\n%s", out)
				}
				return
			}
			if strings.Count(out, "\n") != 1 || !strings.Contains(out, `"level":"warn"`) || !strings.Contains(out, tc.warn) ||
				!strings.Contains(out, "publisher.PingOptions()") || !strings.Contains(out, "-nats-ping-interval") {
				t.Fatalf("log:\n%s\nwant one warning saying %q and naming publisher.PingOptions() and -nats-ping-interval", out, tc.warn)
			}
		})
	}
	if o := (&nats.Options{}); func() bool {
		for _, f := range opts {
			f(o)
		}
		return o.PingInterval != publisher.DefaultPingInterval || o.MaxPingsOut != publisher.DefaultMaxPingsOut
	}() {
		t.Errorf("PingOptions set %v and %d, want %v and %d", o.PingInterval, o.MaxPingsOut, publisher.DefaultPingInterval, publisher.DefaultMaxPingsOut)
	}
}

// The warning compares with the registry's lease: the recommended pings
// are too slow for a 10 s lease.
func TestNewWarnsOfPingsSlowForAShortLease(t *testing.T) {
	r := newRig(t, 10*time.Second)
	nc := r.srv.Connect(t, publisher.PingOptions()...)
	var logs testutil.SyncBuffer
	p, err := publisher.New(nc, r.reg, publisher.Config{Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if want := "not within half the registry lease (5s of 10s)"; !strings.Contains(logs.String(), want) {
		t.Fatalf("log:\n%s\nwant a warning saying %q", logs.String(), want)
	}
}
