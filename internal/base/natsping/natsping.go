// Package natsping is pushlb's one definition of how often a NATS client
// pings its server, so that a dead link or a paused server is noticed
// before the registry's leases end: the defaults natsconn gives both
// binaries, the options that publisher.PingOptions and pushlb.PingOptions
// give programs that build their own connection, and the check behind the
// warning of publisher.New and of pushlb's Client.Start.
//
// nats.go pings the server every PingInterval and counts the pings not
// answered yet; the ping timer that finds more than MaxPingsOut of them
// declares the connection stale, and the client reconnects (to another
// server of a cluster) and says so to its disconnect callback. Until then a
// half-open connection (a paused server, a link that died without a reset)
// looks alive: writes go into the socket's buffer and are lost. So a link
// that dies just after an answer is noticed after MaxPingsOut to
// MaxPingsOut+1 intervals. nats.go's default, 2 min and 2, takes 4 to 6
// minutes: eight to twelve 30 s leases, during which an instance's lease
// renewals are lost unnoticed and its record is reaped. The default here,
// 5 s and 2, notices it in 10 to 15 s, within half the default lease, so
// that the publisher's re-announcement after the reconnect renews the lease
// in time. It costs one PING and one PONG (6 bytes each) per interval per
// connection.
package natsping

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

const (
	// DefaultInterval is how often a connection pings its server.
	DefaultInterval = 5 * time.Second
	// DefaultMaxOut is how many pings may go unanswered: the timer that
	// finds one more declares the connection stale. nats.go's default too.
	DefaultMaxOut = 2
)

// Options returns the options that set DefaultInterval and DefaultMaxOut,
// for nats.Connect.
func Options() []nats.Option {
	return []nats.Option{nats.PingInterval(DefaultInterval), nats.MaxPingsOutstanding(DefaultMaxOut)}
}

// Slow reports whether a connection that pings every interval with maxOut
// pings outstanding notices a dead link too late for lease: its pings are
// off (interval zero or negative, as nats.go reads it), or interval x
// maxOut is not below half the lease. A maxOut below 1 counts as 1 (nats.go
// then gives up at the first unanswered ping).
func Slow(interval time.Duration, maxOut int, lease time.Duration) bool {
	if interval <= 0 {
		return true
	}
	half := lease / 2
	if interval >= half { // also keeps the product below from overflowing
		return true
	}
	return detection(interval, maxOut) >= half
}

// detection is how long a connection that pings every interval with
// maxOut pings outstanding takes at least to notice a dead link: the timer
// after that declares it stale, one interval later at most.
func detection(interval time.Duration, maxOut int) time.Duration {
	return interval * time.Duration(max(maxOut, 1))
}

// Warn logs one warning to log when nc's pings are too slow for lease
// (Slow over nc.Opts.PingInterval and nc.Opts.MaxPingsOut), ending with
// fix, what the caller should change; it reports whether it warned.
func Warn(nc *nats.Conn, lease time.Duration, log zerolog.Logger, fix string) bool {
	// Opts is the connection's copy, set before Connect returned.
	interval, maxOut := nc.Opts.PingInterval, nc.Opts.MaxPingsOut
	if !Slow(interval, maxOut, lease) {
		return false
	}
	ev := log.Warn().Dur("lease", lease).Dur("ping_interval", interval).Int("max_pings_out", maxOut)
	if interval <= 0 {
		ev.Msgf("the NATS connection sends no pings: a paused NATS server or a dead link may go unnoticed past the registry lease (%v), its renewals lost; %s", lease, fix)
		return true
	}
	d := detection(interval, maxOut)
	ev.Msgf("the NATS connection's pings (every %v, %d unanswered at most) notice a paused NATS server or a dead link %v to %v after it happens, not within half the registry lease (%v of %v): lease renewals may be lost unnoticed until the lease ends; %s",
		interval, maxOut, d, d+interval, lease/2, lease, fix)
	return true
}
