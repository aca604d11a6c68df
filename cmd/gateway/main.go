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
// config file may add routes. The admin listener serves /-/lb (JSON, or
// HTML for a browser), /metrics (Prometheus) and /healthz.
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

	"github.com/pushlb/pushlb/internal/gateway"
	"github.com/pushlb/pushlb/internal/gossipflag"
	"github.com/pushlb/pushlb/internal/logx"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configFile = fs.String("config", "", "configuration file: YAML, or Ribbon .properties for the balancer settings")
		listen     = fs.String("listen", "", "proxy address (default 127.0.0.1:8080)")
		admin      = fs.String("admin", "", `admin address for /-/lb, /metrics, /healthz (default 127.0.0.1:8081; "off" to disable)`)
		natsURL    = fs.String("nats", "", "NATS server URL; empty starts an embedded server with JetStream")
		embedded   = fs.String("embedded-nats", "", "address of the embedded NATS server (default 127.0.0.1:4222)")
		dataDir    = fs.String("data-dir", "", "JetStream data directory of the embedded server (default: a temporary directory)")
		zone       = fs.String("zone", "", "the gateway's zone, for zone affinity and preference")
		prefix     = fs.String("prefix", "", `NATS subject prefix (default "lb")`)
		lease      = fs.Duration("lease", 0, "registry lease (TTL); must match the announcers' (default 30s)")
		creds      = fs.String("creds", "", "NATS credentials file")
		user       = fs.String("user", "", "NATS user")
		password   = fs.String("password", "", "NATS password")
		token      = fs.String("token", "", "NATS token")
		tlsCA      = fs.String("tls-ca", "", "CA certificate for NATS TLS")
		tlsCert    = fs.String("tls-cert", "", "client certificate for NATS TLS")
		tlsKey     = fs.String("tls-key", "", "client key for NATS TLS")
		demo       = fs.Bool("demo", false, "also start three local backends in two zones that announce themselves (service \"demo\")")
		logLevel   = fs.String("log-level", "info", "log level: debug, info, warn, error")
		gossipSet  gossipflag.Settings
	)
	gossipSet.Register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gateway [-config FILE] [-listen ADDR] [-admin ADDR] [-nats URL] [-zone Z] [-gossip-bind host:port] [-gossip host:port[,..]] [-demo]")
		fmt.Fprintln(stderr, "\nRoutes /<service>/<rest> to the instances of <service> that announced themselves over NATS.")
		fmt.Fprintln(stderr, "Example: gateway -demo    (embedded NATS, three demo backends)")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gateway: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	log, err := newLogger(*logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}

	cfg := gateway.DefaultConfig()
	if *configFile != "" {
		if cfg, err = gateway.LoadFile(*configFile); err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
	}
	// Flags given on the command line override the file.
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "listen":
			cfg.Listen = *listen
		case "admin":
			cfg.Admin = *admin
		case "nats":
			cfg.NATS.URL = *natsURL
		case "embedded-nats":
			cfg.EmbeddedNATS = *embedded
		case "data-dir":
			cfg.DataDir = *dataDir
		case "zone":
			cfg.Zone = *zone
		case "prefix":
			cfg.Prefix = *prefix
		case "lease":
			cfg.Lease = *lease
		case "creds":
			cfg.NATS.CredsFile = *creds
		case "user":
			cfg.NATS.User = *user
		case "password":
			cfg.NATS.Password = *password
		case "token":
			cfg.NATS.Token = *token
		case "tls-ca":
			cfg.NATS.TLS.CA = *tlsCA
		case "tls-cert":
			cfg.NATS.TLS.Cert = *tlsCert
		case "tls-key":
			cfg.NATS.TLS.Key = *tlsKey
		case "demo":
			cfg.Demo = *demo
		case "gossip":
			cfg.Gossip.Join = gossipSet.Join
		case "gossip-bind":
			cfg.Gossip.Bind = gossipSet.Bind
		case "gossip-profile":
			cfg.Gossip.Profile = gossipSet.Profile
		case "gossip-key":
			cfg.Gossip.Key = gossipSet.Key
		case "gossip-label":
			cfg.Gossip.Label = gossipSet.Label
		}
	})
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

// newLogger logs human-readable lines on a terminal and JSON otherwise.
func newLogger(level string, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("bad -log-level %q: want debug, info, warn or error", level)
	}
	return logx.New(w, lvl), nil
}
