package pushlb

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/base/natsping"
)

// PingOptions returns the options to make a client's NATS connection with:
// a ping every 5 s, given up after 2 unanswered (nats.PingInterval,
// nats.MaxPingsOutstanding), so that a paused NATS server or a dead link,
// a connection that looks open while nothing gets through, is noticed
// within 10 to 15 s and the client reconnects (to another server of a
// cluster) and resyncs, below half the default lease (30 s). nats.go's own
// default, a ping every 2 min, notices it after 4 to 6 min. They cost one
// PING and one PONG per interval. Add them to the connection's own
// options:
//
//	nc, err := nats.Connect(url, append(pushlb.PingOptions(), nats.Name("my-gateway"))...)
//
// Start logs a warning when the connection's PingInterval x MaxPingsOut is
// not below half the registry's lease.
func PingOptions() []nats.Option { return natsping.Options() }

// warnSlowPings logs Start's warning when nc's pings notice a dead link
// too late for the registry's lease.
func warnSlowPings(nc *nats.Conn, lease time.Duration, log zerolog.Logger) {
	natsping.Warn(nc, lease, log, "connect with pushlb.PingOptions(), or with nats.PingInterval x nats.MaxPingsOutstanding below half the lease (the gateway: -nats-ping-interval, nats.pingInterval)")
}
