package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/balancer/lbconfig"
	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/dns"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/base/yamlx"
	"github.com/pushlb/pushlb/internal/cli/gossipflag"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// ErrConfig wraps every configuration error; cmd/gateway exits 2 on it.
var ErrConfig = errors.New("gateway: invalid config")

// Config is the gateway's configuration: a YAML file, then command-line
// flags over it. Zero values take the defaults of DefaultConfig.
type Config struct {
	// Listen is the proxy's address. Default 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// Admin is the admin listener (/-/lb, /metrics, /healthz, /readyz).
	// Default 127.0.0.1:8081; "off" disables it.
	Admin string `yaml:"admin"`
	// HTTP holds the timeouts and limits of the proxy listener.
	HTTP HTTPConfig `yaml:"http"`
	// Zone is the gateway's own zone, for the zone filters of every client
	// that does not set one.
	Zone string `yaml:"zone"`
	// Region is the gateway's own region and RegionPriority the other
	// regions in the order it fails over to them, for every client that
	// sets no region (pushlb.Config's Region; docs/balancer.md, "Regions").
	// Default none: the instances' regions are ignored.
	Region         string   `yaml:"region"`
	RegionPriority []string `yaml:"regionPriority"`
	// RemoteRegions are the other regions whose records this region's
	// registry holds copies of, made by the leading reaper
	// (pushlb.Config.RemoteRegions; docs/multiregion.md). Each names its
	// region, the JetStream domain its registry is read through and its
	// bucket: with neither domain nor bucket, the domain is the region's
	// name (the leaf-node topology: a domain per region); with a bucket
	// and no domain, the bucket is read through this connection's own
	// JetStream (a supercluster: one domain). Needs region and reaper.
	RemoteRegions []serverlist.RemoteRegion `yaml:"remoteRegions"`
	// Prefix is the NATS subject prefix. Default "lb".
	Prefix string `yaml:"prefix"`
	// Lease is the registry's lease (the bucket's TTL), which the bucket
	// holds: 0, the default, takes the bucket's, or 30 s when this gateway
	// creates it. A lease given here creates the bucket with it, and the
	// gateway refuses to start when an existing bucket has another
	// (pushlb.Config.Lease).
	Lease time.Duration `yaml:"lease"`
	// RegistryReplicas is the replicas of the registry bucket, 1 to 5: those
	// it is created with, and the count the gateway raises an existing bucket
	// with fewer to (never lowered; a warning if the NATS user may not).
	// Default 0: min(3, the JetStream servers of the cluster).
	RegistryReplicas int `yaml:"registryReplicas"`

	// NATS is the connection to an existing NATS server (several URLs,
	// comma-separated, for a cluster). With an empty URL the gateway starts
	// an embedded server with JetStream.
	NATS natsconn.Config `yaml:"nats"`
	// EmbeddedNATS is where the embedded server listens. Default
	// 127.0.0.1:4222.
	EmbeddedNATS string `yaml:"embeddedNats"`
	// DataDir holds the embedded server's JetStream data. Default: a
	// temporary directory removed at exit.
	DataDir string `yaml:"dataDir"`
	// DataSync is the embedded server's JetStream sync policy: "always"
	// (every write forced to disk before it is acknowledged) or a duration
	// (at most that long after a write, at least 1s). Empty: 2m
	// (DefaultDataSync). Only with the embedded server: a NATS server of
	// one's own sets its own (docs/reliability.md).
	DataSync string `yaml:"dataSync"`

	// Subscriber tunes the push path.
	Subscriber SubscriberConfig `yaml:"subscriber"`

	// Limits bound what announcements alone (events without a registry
	// entry) can make the gateway hold; zero fields take the defaults.
	Limits pushlb.Limits `yaml:"limits"`
	// Follow is what the gateway follows (pushlb.Config.Follow): "all"
	// (every service: the dashboard and /-/lb show the fleet; the xDS
	// server needs it), "listed" (subscriber.services and the services the
	// balancer section names), "requested" (those, and each service a
	// request asks for, from the first request; unfollowed after
	// idleUnfollow without one). Default: "all" with an extension that
	// serves every service (-xds), else "listed" when subscriber.services
	// is set, "all" with demo, "requested" otherwise.
	Follow pushlb.FollowMode `yaml:"follow"`
	// IdleUnfollow is how long a service followed on request stays
	// followed without a request. Default 10m.
	IdleUnfollow time.Duration `yaml:"idleUnfollow"`
	// FollowTimeout bounds the first request for a service not followed
	// yet. Default 5s.
	FollowTimeout time.Duration `yaml:"followTimeout"`
	// Report, when its id is set, makes the gateway publish what it has
	// applied of each service it follows on <prefix>.report.<id>, at most
	// once per interval (pushlb.Config.Report), for a fleet view.
	Report pushlb.ReportConfig `yaml:"report"`
	// DNS serves the pushed lists over DNS: an authoritative responder on
	// UDP and TCP at dns.listen (-dns), with the gateway's zone unless
	// dns.zone names another (package dns, docs/dns.md). Default off (no
	// listen address).
	DNS dns.Config `yaml:"dns"`
	// FleetView makes the gateway a viewer of every gateway's reports: its
	// admin /-/fleet says, per service, which gateways are behind the
	// newest revision and for how long. Default off.
	FleetView bool `yaml:"fleetView"`
	// ServiceGrace is how long a service with no instance left and no
	// request keeps its balancer (services the balancer section names keep
	// theirs). Default 5m.
	ServiceGrace time.Duration `yaml:"serviceGrace"`
	// EmptyListHold keeps a service's last list when the registry loses
	// all of its instances at once (pushlb.Config.EmptyListHold), at most
	// this long; negative: off.
	EmptyListHold time.Duration `yaml:"emptyListHold"`

	// Routes map path prefixes to services, in addition to the default
	// /<service>/<rest> rule (unless DefaultRoutes is false). A route may
	// read balancer hints from its requests (zoneHeader, hashKey).
	Routes        []lbhttp.Route `yaml:"routes"`
	DefaultRoutes *bool          `yaml:"defaultRoutes"`
	// Hints are the balancer hints of the default rule, and of the routes
	// for the fields they leave empty: a header naming the zone to prefer,
	// and where a request's key for keyed rules (Rendezvous) comes from.
	// Default: none.
	Hints lbhttp.Hints `yaml:"hints"`
	// RetryBudget bounds each service's retries (lbhttp.RetryBudget).
	// Default: 20 % of the requests in flight, at least 3 at once.
	RetryBudget lbhttp.RetryBudget `yaml:"retryBudget"`

	// Balancer holds the per-client balancer settings: defaults and
	// clients, as lbconfig.LoadYAML reads them. Its ClientsConfig is nil
	// until the file sets it or Validate fills in the defaults.
	Balancer lbconfig.Section `yaml:"balancer"`

	// ShutdownTimeout bounds how long in-flight requests may take to finish
	// on SIGTERM. Default 10s.
	ShutdownTimeout time.Duration `yaml:"shutdownTimeout"`

	// Gossip makes the gateway a memberlist member, so crashed instances
	// that joined with announce -gossip are noticed within the profile's
	// detection time. Off unless Bind or Join is set.
	Gossip gossipflag.Settings `yaml:"gossip"`

	// Reaper makes the gateway take part in the election of the registry's
	// reaper, which removes the record of an instance whose lease ended
	// (pushlb.Config.Reaper). Default true: the gateway reaps, a library
	// client only when asked. The leader alone receives the leases'
	// expiry messages (the renewals, on a bucket without message
	// schedules); a gateway whose NATS user may not write the
	// reaper's lock logs it once and stays out. Keep at least one process
	// of the deployment able to reap (docs/security.md).
	Reaper bool `yaml:"reaper"`

	// Pprof serves net/http/pprof's profiles under /debug/pprof/ on the
	// admin listener. Default off.
	Pprof bool `yaml:"pprof"`

	// Demo starts three local backends in two zones that announce
	// themselves as service "demo".
	Demo bool `yaml:"demo"`
	// DemoPort is the first of the three consecutive ports the demo
	// backends listen on (127.0.0.1); 0, the default, lets the system pick
	// free ports.
	DemoPort int `yaml:"demoPort"`
}

// follow is the mode the gateway runs in: Follow, or its default;
// wholeFleet is set when an extension serves every service.
func (c Config) follow(wholeFleet bool) pushlb.FollowMode {
	switch {
	case c.Follow != "":
		return c.Follow
	case wholeFleet:
		// An extension serves every service (the xDS server).
		return pushlb.FollowAll
	case len(c.Subscriber.Services) > 0:
		return pushlb.FollowListed
	case c.Demo:
		// The demo's page shows its three backends before any request.
		return pushlb.FollowAll
	default:
		return pushlb.FollowRequested
	}
}

// SubscriberConfig tunes the subscriber.
type SubscriberConfig struct {
	// Services are services always followed: with follow unset, the
	// gateway follows these only ("listed"). Empty: see Config.Follow.
	Services []string `yaml:"services"`
	// Coalesce is the minimum time between two rebuilds of one service.
	// Default 10ms.
	Coalesce time.Duration `yaml:"coalesce"`
	// AntiEntropy is the full reconciliation interval. Default 60s.
	AntiEntropy time.Duration `yaml:"antiEntropy"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:8080",
		Admin:           "127.0.0.1:8081",
		Prefix:          events.DefaultPrefix,
		EmbeddedNATS:    "127.0.0.1:4222",
		ShutdownTimeout: 10 * time.Second,
		ServiceGrace:    pushlb.DefaultServiceGrace,
		IdleUnfollow:    pushlb.DefaultIdleUnfollow,
		Report:          pushlb.ReportConfig{Interval: convergence.DefaultInterval},
		FollowTimeout:   5 * time.Second,
		EmptyListHold:   pushlb.DefaultEmptyListHold,
		RetryBudget:     lbhttp.DefaultRetryBudget,
		Reaper:          true,
		HTTP:            DefaultHTTPConfig(),
		Subscriber:      SubscriberConfig{Coalesce: subscriber.DefaultCoalesce, AntiEntropy: subscriber.DefaultAntiEntropy},
	}
}

// LoadFile reads a configuration file over DefaultConfig: YAML (.yaml,
// .yml) for the whole gateway, or a Ribbon .properties file for the
// balancer settings only. A YAML file's errors, unknown keys and values
// out of range alike, are reported together, each naming the file, the
// line and the key path: "gateway: invalid config: gw.yaml:3: lease: 1ms
// is below the minimum 1s (0: the bucket's)".
func LoadFile(path string) (Config, error) {
	cfg := DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".properties":
		bc, err := lbconfig.LoadProperties(bytes.NewReader(data))
		if err != nil {
			return cfg, fmt.Errorf("%w: %s: %w", ErrConfig, path, &settingError{msg: detail(err, balancer.ErrInvalidConfig), err: err})
		}
		cfg.Balancer.ClientsConfig = bc
		if err := cfg.problems().err(); err != nil {
			return cfg, fmt.Errorf("%w: %s: %w", ErrConfig, path, err)
		}
	case ".yaml", ".yml":
		check := func() error { return cfg.problems().inFile() } // on what was decoded
		if err := yamlx.DecodeFile(path, data, &cfg, yamlx.Check(check)); err != nil {
			return cfg, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	default:
		return cfg, fmt.Errorf("%w: %s: unknown file type (want .yaml, .yml or .properties)", ErrConfig, path)
	}
	return cfg, nil
}

// Validate reports every invalid setting, wrapping ErrConfig, one per
// line after the prefix ("gateway: invalid config: lease: 1ms is below
// ..."), and fills defaults that depend on other settings.
func (c *Config) Validate() error {
	if err := c.problems().err(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// problem is one invalid setting.
type problem struct {
	key string // its key path in a configuration file: "lease", "nats.url"
	msg string // what is wrong with it
	// flagMsg, when set, says it for the command line, naming flags
	// (natsconn's problems); otherwise key and msg say it.
	flagMsg string
	// err is the error of another package that found it, wrapped for
	// errors.Is without repeating its prefix; nil for the gateway's own.
	err error
}

type problems []problem

// err returns the problems as errors joined, nil for none.
func (ps problems) err() error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		msg := p.key + ": " + p.msg
		if p.flagMsg != "" {
			msg = p.flagMsg
		}
		errs[i] = &settingError{msg: msg, err: p.err}
	}
	return errors.Join(errs...)
}

// inFile returns the problems as *yamlx.Error values, for yamlx to put on
// the lines of their keys (yamlx.Check).
func (ps problems) inFile() error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = &yamlx.Error{Path: p.key, Msg: p.msg, Err: p.err}
	}
	return errors.Join(errs...)
}

// settingError is a problem as Validate returns it.
type settingError struct {
	msg string
	err error
}

func (e *settingError) Error() string { return e.msg }
func (e *settingError) Unwrap() error { return e.err }

// detail is err's message without sentinel's ("gossip: invalid config: "),
// for a problem whose key path already says where it is: each error
// prefixed once.
func detail(err, sentinel error) string {
	return strings.ReplaceAll(err.Error(), sentinel.Error()+": ", "")
}

// hintKey matches lbhttp's hint errors that start with the key at fault:
// `zoneHeader "x" is not ...`, `split[1].subset: selector ...`.
var hintKey = regexp.MustCompile(`^([A-Za-z]+(?:\[\d+\])?(?:\.[A-Za-z]+(?:\[\d+\])?)*)(?:: | ")`)

// hintProblem is a hints error of the hints at path, placed at the key it
// starts with ("routes[0].zoneHeader"), or else at path.
func hintProblem(path string, err error) problem {
	msg := detail(err, lbhttp.ErrInvalidOption)
	if m := hintKey.FindStringSubmatch(msg); m != nil {
		path += "." + m[1]
		msg = strings.TrimPrefix(msg[len(m[1]):], ": ")
		msg = strings.TrimPrefix(msg, " ")
	}
	return problem{key: path, msg: msg, err: err}
}

// problems checks every setting and fills the defaults that depend on
// others (the balancer section's).
func (c *Config) problems() problems {
	var ps problems
	bad := func(key, format string, a ...any) {
		ps = append(ps, problem{key: key, msg: fmt.Sprintf(format, a...)})
	}
	from := func(key string, err, sentinel error) {
		ps = append(ps, problem{key: key, msg: detail(err, sentinel), err: err})
	}
	if c.Listen == "" {
		bad("listen", "empty address")
	}
	if c.Admin == "" {
		bad("admin", `empty address (use "off" to disable)`)
	}
	ps = append(ps, c.HTTP.problems()...)
	if err := events.ValidatePrefix(c.Prefix); err != nil {
		from("prefix", err, events.ErrInvalidPrefix)
	}
	// The ping interval is checked against the lease when a valid one is
	// given; with the bucket's, pushlb's Client.Start warns when it is too
	// long for it.
	lease := c.Lease
	if lease < serverlist.MinTTL {
		lease = 0 // the bucket's, or a lease reported below
	}
	for _, err := range []error{c.NATS.Validate(), c.NATS.ValidateLease(lease)} {
		var nps natsconn.Problems
		if errors.As(err, &nps) {
			for _, p := range nps {
				ps = append(ps, problem{key: "nats." + p.Key, msg: p.Msg, flagMsg: p.FlagMsg, err: natsconn.ErrInvalidConfig})
			}
		}
	}
	if c.NATS.URL == "" {
		if _, port, err := net.SplitHostPort(c.EmbeddedNATS); err != nil {
			bad("embeddedNats", "%q: %v", c.EmbeddedNATS, err)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			bad("embeddedNats", "%q: bad port %q", c.EmbeddedNATS, port)
		}
		if _, err := parseDataSync(c.DataSync); err != nil {
			bad("dataSync", "%v", err)
		}
	} else if c.DataSync != "" {
		bad("dataSync", "%q: the embedded server's sync policy, but nats.url (-nats) is set and no server is embedded (a server of one's own takes sync_interval in its jetstream block)", c.DataSync)
	}
	if c.DemoPort < 0 || c.DemoPort > 65535-(demoBackends-1) {
		bad("demoPort", "%d: want 0 (ports the system picks) or a first port of %d free ones, at most %d", c.DemoPort, demoBackends, 65535-(demoBackends-1))
	}
	if c.Lease != 0 && c.Lease < serverlist.MinTTL {
		bad("lease", "%v is below the minimum %v (0: the bucket's)", c.Lease, serverlist.MinTTL)
	}
	for i := range c.RemoteRegions {
		if rem := &c.RemoteRegions[i]; rem.Domain == "" && rem.Bucket == "" {
			rem.Domain = rem.Name
		}
	}
	if len(c.RemoteRegions) > 0 {
		rc := serverlist.ReplicatorConfig{Region: c.Region, Remotes: c.RemoteRegions}
		switch err := rc.Validate(); {
		case err != nil:
			from("remoteRegions", err, serverlist.ErrInvalidConfig)
		case !c.Reaper:
			bad("remoteRegions", "the copies are made by the leading reaper: needs reaper (-reaper)")
		case c.NATS.URL == "":
			bad("remoteRegions", "needs a NATS server joined to the other regions (nats.url, -nats; docs/multiregion.md): the embedded server is joined to none")
		}
	}
	if c.RegistryReplicas < 0 || c.RegistryReplicas > serverlist.MaxReplicas {
		bad("registryReplicas", "%d: 1 to %d, or 0 for min(3, the cluster's JetStream servers)", c.RegistryReplicas, serverlist.MaxReplicas)
	}
	for i, s := range c.Subscriber.Services {
		if err := events.ValidateService(s); err != nil {
			from(fmt.Sprintf("subscriber.services[%d]", i), err, events.ErrInvalidService)
		}
	}
	if c.Subscriber.AntiEntropy < 0 {
		bad("subscriber.antiEntropy", "%v is negative", c.Subscriber.AntiEntropy)
	}
	if c.ServiceGrace <= 0 {
		bad("serviceGrace", "%v is not positive", c.ServiceGrace)
	}
	switch c.Follow {
	case "", pushlb.FollowListed, pushlb.FollowRequested:
	case pushlb.FollowAll:
		if len(c.Subscriber.Services) > 0 {
			bad("follow", "all follows every service: subscriber.services must be empty (use listed or requested)")
		}
	default:
		bad("follow", "%q: all, listed or requested", c.Follow)
	}
	if c.DNS.Addr != "" {
		if err := c.DNS.Validate(); err != nil {
			from("dns", err, dns.ErrInvalidConfig)
		}
	}
	if c.Report.ID != "" {
		if err := convergence.ValidateID(c.Report.ID); err != nil {
			bad("report.id", "%v", err)
		}
	}
	if c.Report.Interval < convergence.MinInterval {
		bad("report.interval", "%v is below %v", c.Report.Interval, convergence.MinInterval)
	}
	if c.IdleUnfollow <= 0 {
		bad("idleUnfollow", "%v is not positive", c.IdleUnfollow)
	}
	if c.FollowTimeout <= 0 {
		bad("followTimeout", "%v is not positive", c.FollowTimeout)
	}
	if c.Limits.ConfirmWithin < 0 {
		bad("limits.confirmWithin", "%v is negative", c.Limits.ConfirmWithin)
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdownTimeout", "%v is negative", c.ShutdownTimeout)
	}
	for i, r := range c.Routes {
		at := fmt.Sprintf("routes[%d]", i)
		if !strings.HasPrefix(r.Prefix, "/") {
			bad(at+".prefix", "%q must start with /", r.Prefix)
		}
		if err := events.ValidateService(r.Service); err != nil {
			from(at+".service", err, events.ErrInvalidService)
		}
		if err := r.Hints.Validate(); err != nil {
			ps = append(ps, hintProblem(at, err))
		}
	}
	if err := c.Hints.Validate(); err != nil {
		ps = append(ps, hintProblem("hints", err))
	}
	if err := c.RetryBudget.Validate(); err != nil {
		// lbhttp says "retry budget: percent ...": the key says the first.
		ps = append(ps, problem{key: "retryBudget", msg: strings.TrimPrefix(detail(err, lbhttp.ErrInvalidOption), "retry budget: "), err: err})
	}
	// Checked with gossip off too (Start warns that they are unused then).
	if err := c.Gossip.Validate(); err != nil {
		from("gossip", err, gossip.ErrInvalidConfig)
	}
	if c.Balancer.ClientsConfig == nil {
		c.Balancer.ClientsConfig = balancer.DefaultClientsConfig()
	}
	if err := c.Balancer.Validate(); err != nil {
		from("balancer", err, balancer.ErrInvalidConfig)
	}
	return ps
}

// defaultRoutes reports whether the /<service>/<rest> rule is on.
func (c *Config) defaultRoutes() bool { return c.DefaultRoutes == nil || *c.DefaultRoutes }
