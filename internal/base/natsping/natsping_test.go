package natsping_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/base/natsping"
)

func TestSlow(t *testing.T) {
	const lease = 30 * time.Second
	for _, tc := range []struct {
		interval time.Duration
		maxOut   int
		slow     bool
	}{
		{natsping.DefaultInterval, natsping.DefaultMaxOut, false}, // 10 s < 15 s
		{nats.DefaultPingInterval, nats.DefaultMaxPingOut, true},  // 4 min
		{0, 2, true},            // pings off
		{-time.Second, 2, true}, // pings off
		{7 * time.Second, 2, false},
		{7500 * time.Millisecond, 2, true}, // 15 s is not below 15 s
		{5 * time.Second, 3, true},
		{14 * time.Second, 0, false}, // nats.go gives up at the first unanswered ping
		{15 * time.Second, 1, true},
		{1 << 62, 4, true}, // no overflow
	} {
		if got := natsping.Slow(tc.interval, tc.maxOut, lease); got != tc.slow {
			t.Errorf("Slow(%v, %d, %v) = %v, want %v", tc.interval, tc.maxOut, lease, got, tc.slow)
		}
	}
	var o nats.Options
	for _, f := range natsping.Options() {
		if err := f(&o); err != nil {
			t.Fatal(err)
		}
	}
	if o.PingInterval != natsping.DefaultInterval || o.MaxPingsOut != natsping.DefaultMaxOut {
		t.Errorf("Options set %v and %d", o.PingInterval, o.MaxPingsOut)
	}
}
