package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/base/yamlx"
	"github.com/pushlb/pushlb/internal/cli/gossipflag"
	"github.com/pushlb/pushlb/internal/cli/logx"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
)

// Defaults of the flags.
const (
	defaultDrainTimeout = 10 * time.Second
	defaultPoll         = 500 * time.Millisecond
	defaultResync       = 30 * time.Second
	defaultTimeout      = 5 * time.Second
	defaultNamePrefix   = "pushlb-"
	// defaultCoalesce is shorter than pushlb's 10 ms: a change costs the
	// sync a few socket commands (~0.1 ms each), and a withdrawal that
	// follows another change of the service within the coalescing window
	// would wait for its end.
	defaultCoalesce = time.Millisecond
	// defaultServerOptions gives a server added at runtime the idle
	// connection pool a server of haproxy.cfg has by default: HAProxy 2.6
	// gives a dynamic server none (pool-max-conn 0), and no default-server
	// line applies to it, so that each request would open a connection.
	defaultServerOptions = "pool-max-conn -1 pool-purge-delay 5s"
	// defaultTLSOptions verifies a secure instance's certificate against
	// the system's trusted authorities (HAProxy 2.6's "@system-ca").
	defaultTLSOptions = "verify required ca-file @system-ca"
	// startTimeout bounds the pushlb client's start (the registry loaded).
	startTimeout = 30 * time.Second
)

// follow is one backend kept equal to one service's list.
type follow struct {
	Service string `yaml:"service"`
	// Backend is the HAProxy backend; empty: the service's name.
	Backend string `yaml:"backend"`
}

// fileConfig is the -config file: the flags' names in camelCase, and the
// backends. A flag given on the command line wins over the file; the
// backends of the file and the command line's arguments add up.
type fileConfig struct {
	Socket        string              `yaml:"socket"`
	Master        bool                `yaml:"master"`
	Zone          string              `yaml:"zone"`
	Check         bool                `yaml:"check"`
	ServerOptions string              `yaml:"serverOptions"`
	TLSOptions    string              `yaml:"tlsOptions"`
	DrainTimeout  time.Duration       `yaml:"drainTimeout"`
	Poll          time.Duration       `yaml:"poll"`
	Resync        time.Duration       `yaml:"resync"`
	Timeout       time.Duration       `yaml:"timeout"`
	Coalesce      time.Duration       `yaml:"coalesce"`
	NamePrefix    string              `yaml:"namePrefix"`
	Resolve       bool                `yaml:"resolve"`
	Metrics       string              `yaml:"metrics"`
	Prefix        string              `yaml:"prefix"`
	LogLevel      string              `yaml:"logLevel"`
	NATS          natsconn.Config     `yaml:"nats"`
	Gossip        gossipflag.Settings `yaml:"gossip"`
	Backends      []follow            `yaml:"backends"`
}

// readConfig decodes the file over o's values (the flags' defaults and
// those given), then parses args again so that the flags given win.
func (o *options) readConfig(path string, fs *flag.FlagSet, args []string, logLevel *string) ([]follow, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-config: %w", err)
	}
	fc := fileConfig{
		Socket: o.socket, Master: o.master, Zone: o.zone, Check: o.check, ServerOptions: o.serverOpts, TLSOptions: o.tlsOpts,
		DrainTimeout: o.drainTimeout, Poll: o.poll, Resync: o.resync, Timeout: o.timeout, Coalesce: o.coalesce,
		NamePrefix: o.namePrefix, Resolve: o.resolve, Metrics: o.metrics, Prefix: o.prefix, LogLevel: *logLevel, NATS: o.nats, Gossip: o.gossip,
	}
	if err := yamlx.DecodeFile(path, data, &fc); err != nil {
		return nil, err
	}
	o.socket, o.master, o.zone, o.check, o.serverOpts, o.tlsOpts = fc.Socket, fc.Master, fc.Zone, fc.Check, fc.ServerOptions, fc.TLSOptions
	o.drainTimeout, o.poll, o.resync, o.timeout, o.coalesce = fc.DrainTimeout, fc.Poll, fc.Resync, fc.Timeout, fc.Coalesce
	o.namePrefix, o.resolve, o.metrics, o.prefix, *logLevel, o.nats, o.gossip = fc.NamePrefix, fc.Resolve, fc.Metrics, fc.Prefix, fc.LogLevel, fc.NATS, fc.Gossip
	if err := fs.Parse(args); err != nil { // the flags given win
		return nil, err
	}
	return fc.Backends, nil
}

// options is the parsed and checked command line.
type options struct {
	socket       string
	master       bool
	zone         string
	check        bool
	drainTimeout time.Duration
	poll         time.Duration
	resync       time.Duration
	timeout      time.Duration
	coalesce     time.Duration
	serverOpts   string
	tlsOpts      string
	namePrefix   string
	resolve      bool
	metrics      string
	prefix       string
	logLevel     zerolog.Level
	follow       []follow
	nats         natsconn.Config
	gossip       gossipflag.Settings
}

const synopsis = `usage: haproxy-sync -socket PATH|HOST:PORT [-master] [-zone Z] [-check] [-config FILE] [flags] SERVICE[=BACKEND]...
Run haproxy-sync -h for every flag.
`

// errHelp is -h: the usage was printed, the exit status is 0.
var errHelp = flag.ErrHelp

// parseArgs reads the command line. Errors are usage errors.
func parseArgs(args []string, out io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("haproxy-sync", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, synopsis)
		fs.PrintDefaults()
	}
	var logLevel, config string
	fs.StringVar(&config, "config", "", "YAML `file` of settings (the flags' names in camelCase, nats: {url: ...}, backends: [{service: orders, backend: be_orders}]); flags given win")
	fs.StringVar(&o.socket, "socket", "", "HAProxy's runtime API: a unix socket `path` (a stats socket \"level admin\", or the master CLI with -master), or host:port")
	fs.BoolVar(&o.master, "master", false, "the socket is the master CLI of a master-worker HAProxy: commands go to the current worker (@1)")
	fs.StringVar(&o.zone, "zone", "", "local `zone`: instances of another zone are added as backup servers (empty: every instance is active)")
	fs.BoolVar(&o.check, "check", false, "add servers with \"check\" and enable their health checks (the backend's default-server settings apply)")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", defaultDrainTimeout, "how long a server leaving gracefully is drained before its sessions are shut down")
	fs.DurationVar(&o.poll, "poll", defaultPoll, "how often HAProxy's process ID is read (a restart or reload)")
	fs.DurationVar(&o.resync, "resync", defaultResync, "how often every backend is read and reconciled regardless (0: never)")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "bound of one runtime API command")
	fs.DurationVar(&o.coalesce, "coalesce", defaultCoalesce, "least time between two applications of one service's list (pushlb.Config.Coalesce)")
	fs.StringVar(&o.serverOpts, "server-options", defaultServerOptions, "keywords added to every \"add server\" (HAProxy 2.6 applies no default-server line to servers added at runtime), e.g. \"check inter 1s\" settings or \"ssl verify none\"")
	fs.StringVar(&o.tlsOpts, "tls-options", defaultTLSOptions, "keywords added after \"ssl\" to the \"add server\" of a secure instance (announced with TLS: https), e.g. \"verify required ca-file /etc/ssl/internal-ca.pem\"")
	fs.StringVar(&o.namePrefix, "name-prefix", defaultNamePrefix, "`prefix` of the server names the sync gives instances; servers without it are left alone")
	fs.BoolVar(&o.resolve, "resolve", true, "resolve an instance's host name before adding it (HAProxy 2.6 does not); false: leave it out, with an error")
	fs.StringVar(&o.metrics, "metrics", "", "serve Prometheus metrics on `addr` (/metrics); empty: none")
	fs.StringVar(&o.prefix, "prefix", events.DefaultPrefix, "pushlb's subject `prefix`")
	fs.StringVar(&logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	o.nats.RegisterFlags(fs)
	o.gossip.Register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var fromFile []follow
	if config != "" {
		var err error
		if fromFile, err = o.readConfig(config, fs, args, &logLevel); err != nil {
			return nil, err
		}
	}
	var problems []error
	if o.socket == "" {
		problems = append(problems, errors.New("-socket is required"))
	} else if _, _, err := parseSocket(o.socket); err != nil {
		problems = append(problems, fmt.Errorf("-socket: %w", err))
	}
	lvl, err := zerolog.ParseLevel(logLevel)
	if err != nil || logLevel == "" {
		problems = append(problems, fmt.Errorf("-log-level: unknown level %q", logLevel))
	}
	o.logLevel = lvl
	if err := o.gossip.Validate(); err != nil {
		problems = append(problems, err)
	}
	if err := events.ValidatePrefix(o.prefix); err != nil {
		problems = append(problems, fmt.Errorf("-prefix: %w", err))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		zero bool
	}{{"drain-timeout", o.drainTimeout, true}, {"poll", o.poll, false}, {"resync", o.resync, true}, {"timeout", o.timeout, false}, {"coalesce", o.coalesce, false}} {
		if d.v < 0 || d.v == 0 && !d.zero {
			problems = append(problems, fmt.Errorf("-%s: %v is not a positive duration", d.name, d.v))
		}
	}
	if o.namePrefix == "" || strings.ContainsFunc(o.namePrefix, func(r rune) bool { return o.serverName(string(r)) != o.namePrefix+string(r) }) {
		problems = append(problems, fmt.Errorf("-name-prefix: %q must be letters, digits, '-', '_', '.' or ':'", o.namePrefix))
	}
	for _, opt := range []struct{ name, v string }{{"server-options", o.serverOpts}, {"tls-options", o.tlsOpts}} {
		if strings.ContainsAny(opt.v, ";\n\r") {
			problems = append(problems, fmt.Errorf("-%s: %q has a ';' or a line break", opt.name, opt.v))
		}
	}
	if fs.NArg() == 0 && len(fromFile) == 0 {
		problems = append(problems, errors.New("no service to follow: give SERVICE[=BACKEND]..."))
	}
	backends := map[string]bool{}
	args = fs.Args()
	for _, f := range fromFile {
		args = append(args, f.Service+"="+f.Backend)
	}
	for _, arg := range args {
		svc, be, _ := strings.Cut(arg, "=")
		if be == "" {
			be = svc
		}
		if err := events.ValidateService(svc); err != nil {
			problems = append(problems, fmt.Errorf("%q: %w", arg, err))
			continue
		}
		if strings.ContainsAny(be, " \t/;") {
			problems = append(problems, fmt.Errorf("%q: backend name %q has a space, '/' or ';'", arg, be))
			continue
		}
		if backends[be] {
			problems = append(problems, fmt.Errorf("%q: backend %q given twice", arg, be))
			continue
		}
		backends[be] = true
		o.follow = append(o.follow, follow{Service: svc, Backend: be})
	}
	if err := errors.Join(problems...); err != nil {
		return nil, &usageError{err}
	}
	return o, nil
}

// usageError is a command line that cannot run: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program: it parses args, follows the services and syncs
// the backends until ctx ends, and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseArgs(args, stdout)
	switch {
	case errors.Is(err, errHelp):
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "haproxy-sync: %v\n%s", err, synopsis)
		return exitUsage
	}
	log := logx.New(stderr, o.logLevel).With().Str("cmd", "haproxy-sync").Logger()
	if err := serve(ctx, o, log); err != nil {
		log.Error().Err(err).Msg("stopped")
		return exitFailure
	}
	return exitOK
}

// serve connects to NATS, starts a pushlb client that follows the services,
// and keeps the backends equal to their lists until ctx ends.
func serve(ctx context.Context, o *options, log zerolog.Logger) error {
	network, addr, _ := parseSocket(o.socket)
	api := &runtimeAPI{network: network, addr: addr, timeout: o.timeout}
	if o.master {
		api.target = "@1 "
	}
	m := newMetrics()
	s := newSyncer(api, o, log, m)

	// A socket that cannot be reached at all at start is a clear error
	// (a wrong path); one that fails later is waited for.
	info, err := api.processInfo(ctx)
	if err != nil {
		return fmt.Errorf("HAProxy's runtime API at %s: %w", api, err)
	}
	log.Info().Str("socket", api.String()).Int("pid", info.PID).Str("version", info.Version).Msg("HAProxy found")

	if o.metrics != "" {
		ln, err := net.Listen("tcp", o.metrics)
		if err != nil {
			return fmt.Errorf("-metrics: %w", err)
		}
		srv := &http.Server{Handler: metricsMux(m), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info().Str("addr", ln.Addr().String()).Msg("metrics served")
	}

	o.nats.Name = "haproxy-sync"
	if o.nats.URL == "" {
		o.nats.URL = natsconn.DefaultURL
	}
	nc, err := natsconn.Connect(ctx, o.nats, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	services := make([]string, 0, len(o.follow))
	for _, f := range o.follow {
		services = append(services, f.Service)
	}
	cfg := pushlb.Config{Coalesce: o.coalesce, Prefix: o.prefix, Zone: o.zone, Follow: pushlb.FollowListed, Services: services}
	o.gossip.WarnIgnored(log)
	if o.gossip.Enabled() {
		gc, err := o.gossip.Config(gossip.Meta{Role: gossip.RoleGateway}, log)
		if err != nil {
			return err
		}
		cfg.Gossip = &gc
	}
	c, err := pushlb.New(nc, cfg, pushlb.WithLogger(log), pushlb.WithListObserver(s.observe))
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	err = c.Start(startCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("starting the pushlb client: %w", err)
	}
	defer c.Close()
	log.Info().Strs("services", services).Str("gossip", c.GossipAddr()).Msg("following")
	s.run(ctx, c)
	log.Info().Msg("stopping")
	return nil
}

func metricsMux(m *metrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	return mux
}
