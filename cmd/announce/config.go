package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/cli/gossipflag"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// mode is what one run of announce does.
type mode int

const (
	modeHold mode = iota + 1
	modeSupervise
	modeOffline
)

func (m mode) String() string {
	switch m {
	case modeHold:
		return "hold"
	case modeSupervise:
		return "supervise"
	case modeOffline:
		return "offline"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// Defaults of the flags.
const (
	defaultReadyTimeout = 30 * time.Second
	defaultDrain        = time.Second
	defaultReason       = "manual"
	// defaultHealthInterval and defaultHealthFailures: publisher's, so the
	// binary and the library behave alike.
	defaultHealthInterval = publisher.DefaultHealthInterval
	defaultHealthFailures = publisher.DefaultHealthFailures
)

// config is the parsed and checked command line.
type config struct {
	mode mode

	nats     natsconn.Config
	prefix   string
	logLevel zerolog.Level

	// Hold and supervise modes.
	instance serverlist.Instance // without Incarnation
	dialAddr string              // where readiness is checked
	health   string
	// healthInterval is the pause between two health checks once the
	// instance is announced (0: no checks after the readiness wait);
	// healthFailures consecutive failures take it down.
	healthInterval time.Duration
	healthFailures int
	readyTimeout   time.Duration
	drain          time.Duration
	lease          time.Duration
	replicas       int
	replace        bool
	command        []string
	gossip         gossipflag.Settings

	// Offline mode.
	reason      string
	incarnation int64
}

// gossipCheckMeta stands in for the instance's gossip Meta when the gossip
// settings are checked: the publisher fills in the real one.
var gossipCheckMeta = gossip.Meta{Role: gossip.RoleInstance, Service: "check", InstanceID: "check", Incarnation: 1}

// usageError is a command-line mistake: announce prints it with the
// synopsis and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// errHelp reports that -h or -help was given: the help was printed, exit 0.
var errHelp = errors.New("help requested")

// flagValues holds the raw flag values before they are checked.
type flagValues struct {
	service, addr, id, zone string
	region                  string
	meta                    metaFlag
	weight                  int
	secure                  bool
	health                  string
	healthInterval          time.Duration
	healthFailures          int
	readyTimeout, drain     time.Duration
	lease                   time.Duration
	replicas                int
	replace                 bool
	gossip                  gossipflag.Settings
	prefix, logLevel        string
	reason                  string
	incarnation             int64
}

// flag groups, in the order the help lists them.
var (
	instanceFlags = []string{"service", "addr", "id", "zone", "region", "weight", "meta", "secure", "health", "health-interval", "health-failures", "ready-timeout", "drain", "lease", "registry-replicas", "replace", "gossip", "gossip-bind", "gossip-profile", "gossip-key", "gossip-key-file", "gossip-label"}
	offlineFlags  = []string{"service", "id", "reason", "incarnation"}
	commonFlags   = []string{"nats", "nats-timeout", "nats-ping-interval", "creds", "nkey", "user", "password", "password-file", "token", "token-file", "tls-ca", "tls-cert", "tls-key", "prefix", "log-level"}
)

// newFlagSet returns the flag set of mode m (offline, or the other two),
// bound to v and nc.
func newFlagSet(m mode, v *flagValues, nc *natsconn.Config) *flag.FlagSet {
	fs := flag.NewFlagSet("announce", flag.ContinueOnError)
	fs.Usage = func() {} // run prints the help or the synopsis itself
	fs.StringVar(&v.service, "service", "", "service `name`, a NATS token of [A-Za-z0-9_-] (required)")
	if m == modeOffline {
		fs.StringVar(&v.id, "id", "", "instance `ID` to announce offline (required)")
		fs.StringVar(&v.reason, "reason", defaultReason, "`reason` carried by the offline event")
		fs.Int64Var(&v.incarnation, "incarnation", 0, "incarnation `N` of the offline event (0: the registry's, else the current time in ns)")
	} else {
		fs.StringVar(&v.addr, "addr", "", "`host:port` gateways dial (required); an empty, 0.0.0.0 or :: host registers the host name")
		fs.StringVar(&v.id, "id", "", "instance `ID` (default host:service:port, as Eureka)")
		fs.StringVar(&v.zone, "zone", "", "availability `zone`")
		fs.StringVar(&v.region, "region", "", "the instance's `region`: gateways with a region of their own route to the nearest one with a reachable instance (empty: the registry's own)")
		fs.IntVar(&v.weight, "weight", serverlist.DefaultWeight, fmt.Sprintf("the instance's share of traffic `N`, relative to the service's other instances (%d to %d); change it by announcing again", serverlist.MinWeight, serverlist.MaxWeight))
		fs.Var(&v.meta, "meta", "metadata label `k=v`, repeatable")
		fs.BoolVar(&v.secure, "secure", false, "the instance speaks TLS")
		fs.StringVar(&v.health, "health", "", "readiness and health check `URL`: wait for a 2xx answer instead of a TCP connect to -addr")
		fs.DurationVar(&v.healthInterval, "health-interval", defaultHealthInterval, "once announced, check health (-health, else a TCP connect to -addr) every `D`; 0: check only before announcing")
		fs.IntVar(&v.healthFailures, "health-failures", defaultHealthFailures, "`N` consecutive failed health checks announce the instance offline (its record removed) until a check passes")
		fs.DurationVar(&v.readyTimeout, "ready-timeout", defaultReadyTimeout, "how long to wait for readiness (0: forever)")
		fs.DurationVar(&v.drain, "drain", defaultDrain, "supervise mode: wait between the offline event and forwarding the signal to the command")
		fs.DurationVar(&v.lease, "lease", 0, "registry lease (TTL, at least 1s) used if announce creates the bucket (0: 30s); an existing bucket's TTL wins (a warning says when they differ), refreshed every third of it")
		fs.IntVar(&v.replicas, "registry-replicas", 0, "replicas of the registry bucket (1 to 5) used if announce creates it (0: min(3, JetStream servers)); an existing bucket is never changed")
		fs.BoolVar(&v.replace, "replace", false, "take the instance ID over even if another live process holds it; that process yields and exits with status 1")
		v.gossip.Register(fs)
	}
	if nc.URL == "" {
		nc.URL = natsconn.DefaultURL
	}
	nc.RegisterFlags(fs)
	fs.StringVar(&v.prefix, "prefix", events.DefaultPrefix, "subject `prefix`; the registry bucket is pushlb_<prefix, . replaced by _>")
	fs.StringVar(&v.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	return fs
}

// parseArgs parses the command line (without the program name). The help
// goes to stdout; errors are returned.
func parseArgs(args []string, stdout io.Writer) (config, error) {
	m := modeHold
	if len(args) > 0 && args[0] == "offline" {
		m, args = modeOffline, args[1:]
	}
	var v flagValues
	var cfg config
	fs := newFlagSet(m, &v, &cfg.nats)
	fs.SetOutput(io.Discard) // run prints parse errors with the synopsis
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout, m, fs)
			return cfg, errHelp
		}
		return cfg, &usageError{msg: err.Error()}
	}
	rest := fs.Args()
	if len(rest) > 0 {
		// flag stops at "--" and at the first non-flag argument; only the
		// former introduces a command.
		if m == modeOffline || len(args) == len(rest) || args[len(args)-len(rest)-1] != "--" {
			if rest[0] == "offline" {
				return cfg, usagef("unexpected argument %q: offline must come first: announce offline -service NAME -id ID", rest[0])
			}
			return cfg, usagef("unexpected argument %q: put the command to supervise after --", rest[0])
		}
		m, cfg.command = modeSupervise, rest
	} else if m != modeOffline && len(args) > 0 && args[len(args)-1] == "--" {
		return cfg, usagef("no command after --")
	}
	cfg.mode = m
	if err := v.check(m, &cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// check validates the flag values and fills cfg.
func (v *flagValues) check(m mode, cfg *config) error {
	if v.service == "" {
		return usagef("-service is required")
	}
	if err := events.ValidateService(v.service); err != nil {
		return usagef("-service %q: %v (one NATS token of [A-Za-z0-9_-], at most %d bytes)", v.service, err, events.MaxServiceLength)
	}
	if err := events.ValidatePrefix(v.prefix); err != nil {
		return usagef("-prefix %q: %v", v.prefix, err)
	}
	cfg.prefix = v.prefix
	lvl, err := parseLevel(v.logLevel)
	if err != nil {
		return err
	}
	cfg.logLevel = lvl
	if err := cfg.nats.Validate(); err != nil {
		return usagef("%v", err)
	}
	if m == modeOffline {
		return v.checkOffline(cfg)
	}
	return v.checkInstance(cfg)
}

func (v *flagValues) checkOffline(cfg *config) error {
	if v.id == "" {
		return usagef("-id is required in offline mode")
	}
	if err := events.ValidateInstanceID(v.id); err != nil {
		return usagef("-id %q: %v", v.id, err)
	}
	if len(v.reason) > events.MaxReasonLength {
		return usagef("-reason: %d bytes, limit %d", len(v.reason), events.MaxReasonLength)
	}
	if v.incarnation < 0 {
		return usagef("-incarnation %d: must be positive", v.incarnation)
	}
	cfg.instance = serverlist.Instance{Service: v.service, InstanceID: v.id}
	cfg.reason, cfg.incarnation = v.reason, v.incarnation
	return nil
}

func (v *flagValues) checkInstance(cfg *config) error {
	// Checked with gossip off too: a bad key or profile is a mistake
	// whether or not it is used yet (run warns that it is not).
	if _, err := v.gossip.Config(gossipCheckMeta, zerolog.Nop()); err != nil {
		return usagef("%v", err)
	}
	cfg.gossip = v.gossip
	if v.addr == "" {
		return usagef("-addr is required")
	}
	host, port, err := splitAddr(v.addr)
	if err != nil {
		return err
	}
	dialHost := host
	if host == "" || host == "0.0.0.0" || host == "::" {
		name, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("-addr %q has no host and the host name is unknown: %w", v.addr, err)
		}
		host, dialHost = name, "127.0.0.1"
	}
	id := v.id
	if id == "" {
		id = host + ":" + v.service + ":" + strconv.Itoa(port)
	}
	if err := events.ValidateInstanceID(id); err != nil {
		return usagef("-id %q: %v", id, err)
	}
	if v.weight < serverlist.MinWeight || v.weight > serverlist.MaxWeight {
		return usagef("-weight %d: %d to %d (default %d)", v.weight, serverlist.MinWeight, serverlist.MaxWeight, serverlist.DefaultWeight)
	}
	if v.health != "" {
		u, err := url.Parse(v.health)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usagef("-health %q: want an http:// or https:// URL", v.health)
		}
	}
	if v.healthInterval < 0 {
		return usagef("-health-interval %v is negative (0 turns the checks after the announcement off)", v.healthInterval)
	}
	if v.healthFailures < 1 {
		return usagef("-health-failures %d: at least 1", v.healthFailures)
	}
	if v.readyTimeout < 0 {
		return usagef("-ready-timeout %v is negative", v.readyTimeout)
	}
	if v.drain < 0 {
		return usagef("-drain %v is negative", v.drain)
	}
	if v.lease != 0 && v.lease < serverlist.MinTTL {
		return usagef("-lease %v: at least %v", v.lease, serverlist.MinTTL)
	}
	// Against the lease asked for; without -lease the bucket's is unknown
	// here, and publisher.New warns when the pings are too slow for it.
	if err := cfg.nats.ValidateLease(v.lease); err != nil {
		return usagef("%v", err)
	}
	cfg.nats = cfg.nats.ForLease(v.lease)
	if v.replicas < 0 || v.replicas > serverlist.MaxReplicas {
		return usagef("-registry-replicas %d: 1 to %d, or 0 for min(3, JetStream servers)", v.replicas, serverlist.MaxReplicas)
	}
	cfg.replicas = v.replicas
	cfg.instance = serverlist.Instance{
		Service:    v.service,
		InstanceID: id,
		Host:       host,
		Port:       port,
		Secure:     v.secure,
		Zone:       v.zone,
		Region:     v.region,
		Metadata:   v.meta.labels(),
	}
	if v.weight != serverlist.DefaultWeight {
		// The default is not written, so that the record stays as readers
		// older than weights know it.
		cfg.instance.Weight = v.weight
	}
	cfg.dialAddr = net.JoinHostPort(dialHost, strconv.Itoa(port))
	cfg.health, cfg.readyTimeout, cfg.drain, cfg.lease = v.health, v.readyTimeout, v.drain, v.lease
	cfg.replace = v.replace
	cfg.healthInterval, cfg.healthFailures = v.healthInterval, v.healthFailures
	return nil
}

// splitAddr splits host:port and checks the port.
func splitAddr(addr string) (host string, port int, err error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, usagef("-addr %q: want host:port (%v)", addr, err)
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, usagef("-addr %q: port %q is not a number from 1 to 65535", addr, p)
	}
	if strings.ContainsAny(host, " \t/") {
		return "", 0, usagef("-addr %q: invalid host %q", addr, host)
	}
	return host, port, nil
}

func parseLevel(s string) (zerolog.Level, error) {
	switch s {
	case "debug":
		return zerolog.DebugLevel, nil
	case "info":
		return zerolog.InfoLevel, nil
	case "warn":
		return zerolog.WarnLevel, nil
	case "error":
		return zerolog.ErrorLevel, nil
	}
	return 0, usagef("-log-level %q: want debug, info, warn or error", s)
}

// metaFlag collects repeated -meta k=v flags.
type metaFlag struct {
	keys, values []string
}

func (m *metaFlag) String() string {
	if m == nil {
		return ""
	}
	parts := make([]string, len(m.keys))
	for i := range m.keys {
		parts[i] = m.keys[i] + "=" + m.values[i]
	}
	return strings.Join(parts, ",")
}

// Set adds one k=v label. The key must be non-empty and new; the value may
// be empty and may contain '='.
func (m *metaFlag) Set(s string) error {
	k, val, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want key=value", s)
	}
	if slices.Contains(m.keys, k) {
		return fmt.Errorf("%q: key %q given twice", s, k)
	}
	m.keys, m.values = append(m.keys, k), append(m.values, val)
	return nil
}

// labels returns the labels as a map, nil when there are none.
func (m *metaFlag) labels() map[string]string {
	if len(m.keys) == 0 {
		return nil
	}
	out := make(map[string]string, len(m.keys))
	for i, k := range m.keys {
		out[k] = m.values[i]
	}
	return out
}
