package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/base/ctxutil"
	"github.com/pushlb/pushlb/internal/cli/logx"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// Exit statuses of announce itself; supervise mode also passes on its
// command's.
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNoExec   = 126 // the command exists but cannot be run, as in shells
	exitNotFound = 127 // the command was not found, as in shells
)

const (
	// opTimeout bounds one network operation: opening the registry, one
	// announce attempt (on top of the claim's wait, see announce), a
	// withdrawal.
	opTimeout = 5 * time.Second
	// withdrawTimeout bounds the withdrawal at shutdown, which delays the
	// command's signal in supervise mode.
	withdrawTimeout = 3 * time.Second
)

func main() {
	started := time.Now()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, started))
}

// run is the whole program: it parses args, runs the mode and returns the
// exit status. started is the process start time, the incarnation.
func run(args []string, stdout, stderr io.Writer, started time.Time) int {
	cfg, err := parseArgs(args, stdout)
	var uerr *usageError
	switch {
	case errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "announce: %v\n%s", uerr, synopsis)
		return exitUsage
	case err != nil:
		fmt.Fprintf(stderr, "announce: %v\n", err)
		return exitFailure
	}
	base := newLogger(stderr, cfg.logLevel)
	log := base.With().Str("service", cfg.instance.Service).Str("id", cfg.instance.InstanceID).Logger()
	a := &app{cfg: cfg, log: log, libLog: base}
	cfg.gossip.WarnIgnored(log)
	a.cfg.instance.Incarnation = started.UnixNano()
	a.cfg.nats.Name = events.AnnouncerName(cfg.instance.Service, cfg.instance.InstanceID) // the reaper's leader reads it (docs/protocol.md, section 7)

	// Signals are handled before the first log line, so that a stop is
	// never lost to the default action once announce said anything; the
	// tests rely on it and signal announce as soon as they read a line.
	a.sigs = make(chan os.Signal, 8)
	notify := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if cfg.mode == modeSupervise {
		notify = append(notify, forwardedSignals...)
	}
	signal.Notify(a.sigs, notify...)
	defer signal.Stop(a.sigs)

	switch cfg.mode {
	case modeSupervise:
		return a.supervise()
	case modeOffline:
		return a.offline()
	default:
		return a.hold()
	}
}

// newLogger logs to w at level: human-readable on a terminal, JSON lines
// otherwise.
func newLogger(w io.Writer, level zerolog.Level) zerolog.Logger {
	return logx.New(w, level).With().Str("cmd", "announce").Logger()
}

// app is one run of announce.
type app struct {
	cfg config
	// log names the instance on every line (fields service and id).
	log zerolog.Logger
	// libLog is log without the instance's fields, for the registry and
	// the publisher: they name the instance on their lines about it
	// themselves, and a field given twice is written twice.
	libLog zerolog.Logger
	sigs   chan os.Signal

	// Set in supervise mode once the command runs, for forwarding.
	child *child
}

// isStop reports whether s asks announce to stop (SIGINT, SIGTERM), as
// opposed to one that supervise mode only forwards.
func isStop(s os.Signal) bool { return s == os.Interrupt || s == syscall.SIGTERM }

// interruptible runs f with a context that a stop signal cancels. It
// returns f's error, or the stop signal when one came (after f returned).
// Signals that are only forwarded are forwarded to the command, if any.
func (a *app) interruptible(f func(ctx context.Context) error) (os.Signal, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	for {
		select {
		case err := <-done:
			return nil, err
		case s := <-a.sigs:
			if !isStop(s) {
				a.forward(s)
				continue
			}
			a.log.Info().Stringer("signal", s).Msg("stopping")
			cancel()
			<-done
			return s, nil
		}
	}
}

// forward passes a signal on to the command, if one runs.
func (a *app) forward(s os.Signal) {
	if a.child == nil {
		return
	}
	a.log.Debug().Stringer("signal", s).Msg("forwarding signal to the command")
	if err := a.child.signal(s); err != nil {
		a.log.Warn().Err(err).Stringer("signal", s).Msg("cannot forward signal to the command")
	}
}

// session is the connection to NATS, the registry and the publisher.
type session struct {
	nc  *nats.Conn
	reg *serverlist.Registry
	pub *publisher.Publisher
}

// connect opens the session of hold and supervise modes. A connection
// whose default pings are too slow for the bucket's lease (-lease 0 takes
// the bucket's, known only once connected) is made again with pings
// fitted to it, before anything is announced over it.
func (a *app) connect(ctx context.Context) (*session, error) {
	for {
		nc, err := a.dial(ctx)
		if err != nil {
			return nil, err
		}
		s, err := a.openRegistry(ctx, nc)
		var refit *refitPings
		if errors.As(err, &refit) {
			nc.Close()
			a.cfg.nats = refit.cfg
			a.log.Info().Dur("lease", refit.lease).Dur("ping_interval", refit.cfg.PingInterval).
				Msg("the registry's lease is short for the default pings: connecting again with pings fitted to it")
			continue
		}
		if err != nil {
			nc.Close()
			return nil, err
		}
		return s, nil
	}
}

// refitPings is openRegistry's answer when the connection's pings are too
// slow for the bucket's lease: connect makes it again with cfg.
type refitPings struct {
	cfg   natsconn.Config
	lease time.Duration
}

func (e *refitPings) Error() string { return "pings too slow for the registry's lease" }

// dial connects to NATS; when nothing answers, the error says what to do.
func (a *app) dial(ctx context.Context) (*nats.Conn, error) {
	nc, err := natsconn.Connect(ctx, a.cfg.nats, a.log)
	if errors.Is(err, natsconn.ErrUnreachable) {
		return nil, fmt.Errorf("%w; start a gateway (it embeds a NATS server on %s), or pass -nats with your NATS server's URL", err, natsconn.DefaultURL)
	}
	return nc, err
}

func (a *app) openRegistry(ctx context.Context, nc *nats.Conn) (*session, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	reg, err := serverlist.Open(octx, js, serverlist.RegistryConfig{Prefix: a.cfg.prefix, TTL: a.cfg.lease, Replicas: a.cfg.replicas, Logger: a.libLog})
	if err != nil {
		return nil, fmt.Errorf("open the registry (is JetStream enabled, nats-server 2.11+?): %w", err)
	}
	if fitted, ok := a.cfg.nats.Refit(reg.Config().TTL); ok {
		return nil, &refitPings{cfg: fitted, lease: reg.Config().TTL}
	}
	pcfg := publisher.Config{Prefix: a.cfg.prefix, Logger: a.libLog, Replace: a.cfg.replace}
	if a.cfg.gossip.Enabled() {
		g, err := a.cfg.gossip.Config(gossipCheckMeta, a.log)
		if err != nil {
			return nil, err
		}
		pcfg.Gossip = &g
	}
	pub, err := publisher.New(nc, reg, pcfg)
	if err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	return &session{nc: nc, reg: reg, pub: pub}, nil
}

// close stops the lease and closes the connection.
func (s *session) close() {
	s.pub.Close()
	s.nc.Close()
}

// announce announces the instance, retrying with backoff until it
// succeeds or ctx ends: once the instance is ready, an outage of NATS only
// delays its announcement. An ID that another live process holds is not
// retried: it returns the error wrapping serverlist.ErrInUse.
//
// An attempt may watch a record another process holds for the claim's
// wait (half the bucket's TTL) before it takes the ID over: its timeout
// is that wait plus opTimeout for its network operations, so that a
// restart after a crash takes its ID over after the wait the protocol
// documents instead of failing and starting over.
func (a *app) announce(ctx context.Context, s *session) error {
	backoff := 100 * time.Millisecond
	attempt := s.pub.ClaimWait() + opTimeout
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := s.pub.Announce(actx, a.cfg.instance)
		cancel()
		if err == nil {
			in := a.cfg.instance
			a.log.Info().Str("host", in.Host).Int("port", in.Port).Str("zone", in.Zone).
				Bool("secure", in.Secure).Int64("incarnation", in.Incarnation).Msg("announced online")
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, serverlist.ErrInUse) {
			return err
		}
		a.log.Warn().Err(err).Stringer("retry_in", backoff).Msg("announce failed; retrying")
		if err := ctxutil.Sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, opTimeout)
	}
}

// withdraw announces the instance offline and removes its registry entry.
// If it was never fully announced (a signal came during the announcement),
// it only removes the entry a half-done announcement may have left, and
// only if that entry is this process's: a refused duplicate removes
// nothing.
func (a *app) withdraw(s *session, reason string) error {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	err := s.pub.Withdraw(ctx, reason)
	switch {
	case errors.Is(err, publisher.ErrNotAnnounced):
		// Nothing announced; a record a cut-short announcement left was
		// removed if it was this process's (never another's).
		a.log.Debug().Msg("nothing to withdraw")
		return nil
	case errors.Is(err, publisher.ErrReplaced):
		return nil // the ID is the replacing process's
	case err != nil:
		return err
	}
	a.log.Info().Str("reason", reason).Msg("announced offline and deregistered")
	return nil
}
