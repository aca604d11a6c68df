// Command gateway is pushlb's gateway: an HTTP reverse proxy whose server
// lists are pushed, not polled. Instances announce themselves over NATS
// (see cmd/announce); the gateway rebuilds the affected balancer the moment
// one comes or goes.
//
//	gateway [-config FILE] [-listen ADDR] [-admin ADDR] [-nats URL] [-zone Z]
//	        [-gossip-bind host:port] [-gossip host:port[,..]] [-demo]
//
// Without -nats it starts an embedded NATS server with JetStream on
// -embedded-nats (127.0.0.1:4222), which announce processes can use. It
// routes /<service>/<rest> to <service> with the prefix stripped; the
// config file may add routes, and per-request hints (hints:, or per route):
// a header naming the zone to prefer, and a key (header, cookie, query
// parameter or client address) for the keyed Rendezvous rule. The admin listener serves /-/lb (JSON, or
// HTML for a browser), /metrics (Prometheus), /healthz (liveness: the
// process serves) and /readyz (routing state loaded; stays ready through a
// NATS outage, which its body shows). The proxy listener has read, idle and
// header timeouts and a connection limit (-http-* flags, http: in YAML).
//
// Crashed instances are removed when their registry lease expires (-lease,
// 30 s) or, with gossip on (-gossip-bind and/or -gossip; instances run
// announce -gossip <gateway's gossip address>), when memberlist declares
// their node dead: about 1 s with -gossip-profile fast, 6-10 s with lan.
//
// -config takes a YAML file (see docs/config.md) or a Ribbon .properties
// file. Flags override the file. A bad configuration exits with status 2.
// SIGINT or SIGTERM stops accepting requests, lets in-flight ones finish
// (bounded by shutdownTimeout), and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/app/gateway"
	"github.com/pushlb/pushlb/internal/cli/logx"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, logLevel, code := parseArgs(args, stderr)
	if code >= 0 {
		return code
	}
	log, err := newLogger(logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	g, err := gateway.New(cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = g.Start(startCtx)
	cancel()
	if err != nil {
		log.Error().Err(err).Msg("gateway failed to start")
		if errors.Is(err, gateway.ErrConfig) {
			return 2
		}
		return 1
	}
	fmt.Fprint(stdout, g.DemoInstructions())
	<-ctx.Done()
	stop()
	log.Info().Msg("signal received: stopping")
	if err := g.Shutdown(context.Background()); err != nil {
		log.Error().Err(err).Msg("shutdown")
		return 1
	}
	return 0
}

// parseArgs reads the command line in two passes over one set of flags:
// the first finds -config, the second parses again over the file's content,
// so the flags given override the file and the others keep its values. It
// returns an exit code >= 0 when the program should stop (help: 0, usage or
// config error: 2), or -1.
func parseArgs(args []string, stderr io.Writer) (cfg gateway.Config, logLevel string, code int) {
	var configFile string
	newFlagSet := func(c *gateway.Config, out io.Writer) *flag.FlagSet {
		fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
		fs.SetOutput(out)
		fs.StringVar(&configFile, "config", configFile, "configuration `file`: YAML, or Ribbon .properties for the balancer settings")
		fs.StringVar(&logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
		c.RegisterFlags(fs)
		fs.Usage = func() {
			fmt.Fprintln(out, "usage: gateway [-config FILE] [-listen ADDR] [-admin ADDR] [-nats URL] [-zone Z] [-gossip-bind host:port] [-gossip host:port[,..]] [-demo]")
			fmt.Fprintln(out, "\nRoutes /<service>/<rest> to the instances of <service> that announced themselves over NATS.")
			fmt.Fprintln(out, "Example: gateway -demo    (embedded NATS, three demo backends)")
			fmt.Fprintln(out)
			fs.PrintDefaults()
		}
		return fs
	}
	cfg = gateway.DefaultConfig()
	first := cfg
	fs := newFlagSet(&first, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, "", 0
		}
		return cfg, "", 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gateway: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return cfg, "", 2
	}
	if configFile != "" {
		var err error
		if cfg, err = gateway.LoadFile(configFile); err != nil {
			fmt.Fprintln(stderr, err)
			return cfg, "", 2
		}
	}
	// The same arguments parsed the first time: no error is possible.
	newFlagSet(&cfg, io.Discard).Parse(args)
	return cfg, logLevel, -1
}

// newLogger logs human-readable lines on a terminal and JSON otherwise.
func newLogger(level string, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("bad -log-level %q: want debug, info, warn or error", level)
	}
	return logx.New(w, lvl), nil
}
