package pushlb_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// pingWarning is what the warning of slow pings says in every case.
const pingWarning = "the registry lease"

// Start warns, once, when the connection's pings would notice a paused
// server or a dead link only after half the registry's lease, naming
// PingOptions; a connection made with PingOptions is not warned about.
func TestStartWarnsOfSlowPings(t *testing.T) {
	srv := natstest.Start(t)
	for _, tc := range []struct {
		name string
		opts []nats.Option
		cfg  pushlb.Config
		warn string // "" for none
	}{
		{"nats.go's default", nil, pushlb.Config{}, "(every 2m0s, 2 unanswered at most)"},
		{"PingOptions", pushlb.PingOptions(), pushlb.Config{}, ""},
		{"PingOptions, a lease they are too slow for", pushlb.PingOptions(), pushlb.Config{Prefix: "short", Lease: 12 * time.Second},
			"not within half the registry lease (6s of 12s)"},
		{"pings off", []nats.Option{nats.PingInterval(0)}, pushlb.Config{}, "sends no pings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := srv.Connect(t, tc.opts...)
			var logs testutil.SyncBuffer
			startWith(t, nc, tc.cfg, pushlb.WithLogger(zerolog.New(&logs)))
			var warnings []string
			for line := range strings.Lines(logs.String()) {
				if strings.Contains(line, pingWarning) && strings.Contains(line, "NATS connection") {
					warnings = append(warnings, line)
				}
			}
			if tc.warn == "" {
				if len(warnings) > 0 {
					t.Fatalf("unexpected warning: %s", warnings)
				}
				return
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], `"level":"warn"`) || !strings.Contains(warnings[0], tc.warn) ||
				!strings.Contains(warnings[0], "pushlb.PingOptions()") || !strings.Contains(warnings[0], "-nats-ping-interval") {
				t.Fatalf("warnings %q, want one saying %q and naming pushlb.PingOptions() and -nats-ping-interval", warnings, tc.warn)
			}
		})
	}
	var o nats.Options
	for _, f := range pushlb.PingOptions() {
		f(&o)
	}
	if o.PingInterval != 5*time.Second || o.MaxPingsOut != 2 {
		t.Errorf("PingOptions set %v and %d, want 5s and 2", o.PingInterval, o.MaxPingsOut)
	}
}
