package gateway

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

	"github.com/pushlb/pushlb/internal/cli/logx"
)

// Main runs the gateway command with args (without the program name) until
// SIGINT or SIGTERM and returns its exit status: 0 after a clean stop, 1
// when it failed to start or stop, 2 for a usage or configuration error.
// cmd/gateway calls it with no extension; a build with extensions (the xds
// module's) passes them, and their flags join the command line.
func Main(args []string, stdout, stderr io.Writer, exts ...Extension) int {
	cfg, proc, code := parseArgs(args, stderr, exts)
	if code >= 0 {
		return code
	}
	log, err := newLogger(proc.logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	// Before anything is loaded: the limit paces the GC of the start too.
	limit, err := chooseMemoryLimit(proc.memoryLimit, "/sys/fs/cgroup", os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "gateway:", err)
		return 2
	}
	limit.apply()
	log.Info().Int64("bytes", limit.bytes).Str("source", limit.source).Msg("memory limit")
	setHeapProfiling(cfg.Pprof)
	g, err := New(cfg, log, exts...)
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
		if errors.Is(err, ErrConfig) {
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
func parseArgs(args []string, stderr io.Writer, exts []Extension) (cfg Config, proc processFlags, code int) {
	var configFile, xds string
	newFlagSet := func(c *Config, out io.Writer) *flag.FlagSet {
		fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
		fs.SetOutput(out)
		fs.StringVar(&configFile, "config", configFile, "configuration `file`: YAML, or Ribbon .properties for the balancer settings")
		fs.StringVar(&proc.logLevel, "log-level", "info", "log `level`: debug, info, warn, error")
		fs.StringVar(&proc.memoryLimit, "memory-limit", memoryLimitAuto, "soft memory `limit` of the Go runtime: a size such as 96MiB (GOMEMLIMIT's syntax), off, or auto: GOMEMLIMIT when set, else 90% of the container's (cgroup's) memory limit when it has one, else none. Lower: less memory, more GC work (docs/perf.md)")
		c.RegisterFlags(fs)
		for _, x := range exts {
			x.RegisterFlags(fs)
		}
		if fs.Lookup("xds") == nil {
			fs.StringVar(&xds, "xds", "", "xDS server `address` (not in this build: build github.com/pushlb/pushlb/xds/cmd/gateway, see docs/xds.md)")
		}
		// The flag package prints a parse error, then calls Usage: the
		// help is printed on -h only, a mistake gets usageHint.
		fs.Usage = func() {}
		return fs
	}
	cfg = DefaultConfig()
	first := cfg
	fs := newFlagSet(&first, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(fs)
			return cfg, proc, 0
		}
		fmt.Fprintln(stderr, usageHint)
		return cfg, proc, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gateway: unexpected argument %q\n%s\n", fs.Arg(0), usageHint)
		return cfg, proc, 2
	}
	if configFile != "" {
		var err error
		if cfg, err = LoadFile(configFile); err != nil {
			fmt.Fprintln(stderr, err)
			return cfg, proc, 2
		}
	}
	// The same arguments parsed the first time: no error is possible.
	newFlagSet(&cfg, io.Discard).Parse(args)
	if xds != "" {
		fmt.Fprintln(stderr, "gateway: -xds: this build has no xDS server; build github.com/pushlb/pushlb/xds/cmd/gateway (docs/xds.md)")
		return cfg, proc, 2
	}
	return cfg, proc, -1
}

// usageHint follows a mistake on the command line, as go's own "Run 'go
// help build' for details": the whole help (-h) is some 60 lines.
const usageHint = `usage: gateway [flags]; "gateway -h" lists them`

// printHelp prints the command's help, the flags of fs included, to fs's
// output.
func printHelp(fs *flag.FlagSet) {
	out := fs.Output()
	fmt.Fprintln(out, "usage: gateway [-config FILE] [-listen ADDR] [-admin ADDR] [-nats URL] [-zone Z] [-gossip-bind host:port] [-gossip host:port[,..]] [-demo]")
	fmt.Fprintln(out, "\nRoutes /<service>/<rest> to the instances of <service> that announced themselves over NATS.")
	fmt.Fprintln(out, "Example: gateway -demo    (embedded NATS, three demo backends)")
	fmt.Fprintln(out)
	fs.PrintDefaults()
}

// processFlags are the flags that set up the process, not the gateway.
type processFlags struct {
	logLevel    string
	memoryLimit string // see chooseMemoryLimit
}

// newLogger logs human-readable lines on a terminal and JSON otherwise.
func newLogger(level string, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("bad -log-level %q: want debug, info, warn or error", level)
	}
	return logx.New(w, lvl), nil
}
