package publisher

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/base/natsping"
)

// The pings a service's NATS connection should make, so that a paused NATS
// server or a dead link (a connection that looks open while nothing gets
// through) is noticed, and the connection renewed, before the instance's
// lease ends: nats.go's own default (a ping every 2 min, 2 unanswered at
// most) notices it after 4 to 6 min, long after a 30 s lease.
const (
	// DefaultPingInterval is how often the connection pings its server.
	DefaultPingInterval = natsping.DefaultInterval
	// DefaultMaxPingsOut is how many pings may go unanswered before the
	// connection is declared stale and reconnected.
	DefaultMaxPingsOut = natsping.DefaultMaxOut
)

// PingOptions returns the options to connect a service with:
// nats.PingInterval(DefaultPingInterval) (5 s) and
// nats.MaxPingsOutstanding(DefaultMaxPingsOut) (2), so that a paused server
// or a dead link is noticed within 10 to 15 s, below half the default
// lease (30 s), and the publisher re-announces the instance on the
// reconnect before its lease ends. They cost one PING and one PONG per
// interval. Add them to the connection's own options:
//
//	nc, err := nats.Connect(url, append(publisher.PingOptions(), nats.Name("orders-1"))...)
//
// With a shorter lease, keep PingInterval x MaxPingsOut below half of it:
// New logs a warning when a connection's are not.
func PingOptions() []nats.Option { return natsping.Options() }

// warnSlowPings logs New's warning when nc's pings notice a dead link too
// late for the registry's lease.
func warnSlowPings(nc *nats.Conn, lease time.Duration, log zerolog.Logger) {
	natsping.Warn(nc, lease, log, "connect with publisher.PingOptions(), or with nats.PingInterval x nats.MaxPingsOutstanding below half the lease (announce: -nats-ping-interval)")
}
