package pushlb

import (
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/serverlist"
)

// Option configures a Client. Each option checks its own value; New then
// checks them together and reports every problem at once, wrapping
// ErrInvalidOption.
type Option func(*options) error

// options is what the Options set; the zero value plus defaults() is the
// zero configuration.
type options struct {
	prefix       string
	lease        time.Duration
	zone         string
	balancers    *balancer.ClientsConfig
	services     []string
	coalesce     time.Duration
	antiEntropy  time.Duration
	serviceGrace time.Duration
	replicas     int
	reaper       *serverlist.ReaperConfig // nil: no reaper
	limits       Limits
	log          zerolog.Logger
	gossip       *gossip.Config
	onEvent      func(events.Event)
	onList       ListObserver
	transport    []lbhttp.Option
	proxy        []lbhttp.ProxyOption
}

func defaultOptions() options {
	return options{
		prefix:       events.DefaultPrefix,
		lease:        serverlist.DefaultTTL,
		log:          zerolog.Nop(),
		serviceGrace: DefaultServiceGrace,
		reaper:       &serverlist.ReaperConfig{},
	}
}

// WithPrefix sets the NATS subject prefix of the deployment (default "lb"):
// events travel on <prefix>.svc.<service>.online|offline and the registry
// bucket is named after it.
func WithPrefix(prefix string) Option {
	return func(o *options) error {
		if err := events.ValidatePrefix(prefix); err != nil {
			return optionError("WithPrefix: %w", err)
		}
		o.prefix = prefix
		return nil
	}
}

// WithLease sets the registry lease (the bucket's TTL) used when the client
// creates the bucket. Default 30s, at least 1s. It must match what the
// announcers use.
func WithLease(d time.Duration) Option {
	return func(o *options) error {
		if d < serverlist.MinTTL {
			return optionError("WithLease: %v is below the minimum %v", d, serverlist.MinTTL)
		}
		o.lease = d
		return nil
	}
}

// WithRegistryReplicas sets the replicas of the registry bucket (1 to 5):
// those it gets when the client creates it, and the count Start raises an
// existing bucket with fewer to (a stream update of its replicas only, in
// the background, logged; never lowered). Default 0: min(3, the JetStream
// servers of the cluster), which the server's placement decides (R1 on a
// lone server); see serverlist.RegistryConfig.Replicas. Without the
// permission to update the stream (docs/security.md) the client logs a
// warning and goes on.
func WithRegistryReplicas(n int) Option {
	return func(o *options) error {
		if n < 0 || n > serverlist.MaxReplicas {
			return optionError("WithRegistryReplicas: %d: 1 to %d, or 0 for min(3, the cluster's JetStream servers)", n, serverlist.MaxReplicas)
		}
		o.replicas = n
		return nil
	}
}

// WithZone sets the zone this process runs in: the zone filters of every
// balancer whose configuration names no zone of its own prefer it.
func WithZone(zone string) Option {
	return func(o *options) error {
		o.zone = zone
		return nil
	}
}

// WithBalancerConfig sets the balancer settings: global defaults and
// per-service overrides (rule, zone filter, breaker, retries, timeouts), as
// balancer/lbconfig loads them from YAML or Ribbon .properties. Services the
// configuration names get a balancer at Start, so a static listOfServers
// works before anything is announced. Default: balancer.DefaultConfig for
// every service.
func WithBalancerConfig(cfg *balancer.ClientsConfig) Option {
	return func(o *options) error {
		if cfg == nil {
			return optionError("WithBalancerConfig: nil configuration")
		}
		if err := cfg.Validate(); err != nil {
			return optionError("WithBalancerConfig: %w", err)
		}
		o.balancers = cfg.Clone()
		return nil
	}
}

// WithServices limits the client to these services; by default it follows
// every service announced under the prefix.
func WithServices(services ...string) Option {
	return func(o *options) error {
		for _, s := range services {
			if err := events.ValidateService(s); err != nil {
				return optionError("WithServices: %w", err)
			}
		}
		o.services = append(o.services, services...)
		return nil
	}
}

// WithCoalesce sets the minimum time between two rebuilds of one service's
// balancer (default 10ms; the first change after a quiet period applies at
// once). A negative value rebuilds on every change.
func WithCoalesce(d time.Duration) Option {
	return func(o *options) error {
		o.coalesce = d
		return nil
	}
}

// WithAntiEntropy sets the interval of full reconciliations with the
// registry (default 60s).
func WithAntiEntropy(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return optionError("WithAntiEntropy: negative interval %v", d)
		}
		o.antiEntropy = d
		return nil
	}
}

// DefaultServiceGrace is how long a service stays after its last instance
// left, unless requests keep asking for it.
const DefaultServiceGrace = 5 * time.Minute

// WithServiceGrace sets how long the balancer of a service with no instance
// left is kept (default 5 min): once its list has been empty and no request
// named it for that long, it is removed, with its stats, unless the balancer
// configuration names the service. A later announcement builds it again.
func WithServiceGrace(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return optionError("WithServiceGrace: %v is not positive", d)
		}
		o.serviceGrace = d
		return nil
	}
}

// WithReaper sets whether the client takes part in the election of the
// registry's reaper (default: it does, with cfg's zero values). The reaper
// removes the record of an instance whose lease ran out (a crash, with no
// gossip to tell it sooner): the registry's records never age out by
// themselves, since leases are kept apart from them so that gateways
// receive no lease renewals (docs/protocol.md, "Leases"). Of all the
// processes that take part, one leads and alone receives the renewals; a
// process whose NATS user may not write the reaper's lock logs it once and
// stays out. Without any reaper, a crashed instance that gossip does not
// report stays registered: keep at least one (docs/security.md gives the
// reaper's permissions). The reaper logs to the client's logger.
func WithReaper(enabled bool, cfg serverlist.ReaperConfig) Option {
	return func(o *options) error {
		if !enabled {
			o.reaper = nil
			return nil
		}
		if cfg.SweepInterval < 0 {
			return optionError("WithReaper: sweep interval %v is negative", cfg.SweepInterval)
		}
		o.reaper = &cfg
		return nil
	}
}

// Limits bound what announcements alone (events, without a registry
// entry) can make a client hold. Instances the registry holds are always
// followed: the registry is access-controlled, the bus may not be. Zero
// fields take the defaults; a negative one means no limit.
type Limits struct {
	// UnconfirmedInstances bounds the instances known only from events, at
	// any moment. Default 10,000.
	UnconfirmedInstances int `yaml:"unconfirmedInstances"`
	// Services and InstancesPerService bound the services, and the
	// instances of one service, that events may add. Default 10,000 each.
	Services            int `yaml:"services"`
	InstancesPerService int `yaml:"instancesPerService"`
	// ConfirmWithin is how long an instance known only from events waits
	// for the registry to show it before it is forgotten. Default 5s.
	ConfirmWithin time.Duration `yaml:"confirmWithin"`
}

// WithLimits sets the limits on what events alone can add (see Limits).
// Events beyond them are dropped and counted (Stats.Events.Dropped,
// reason "limit").
func WithLimits(l Limits) Option {
	return func(o *options) error {
		if l.ConfirmWithin < 0 {
			return optionError("WithLimits: negative ConfirmWithin %v", l.ConfirmWithin)
		}
		o.limits = l
		return nil
	}
}

// WithLogger sets the logger: one info line per list change, warnings for
// dropped input (rate-limited) and failures. Default: no logs.
func WithLogger(l zerolog.Logger) Option {
	return func(o *options) error {
		o.log = l
		return nil
	}
}

// WithGossip makes the client a gossip (memberlist) member with the
// gateway role, so crashed instances that joined the same cluster (announce
// -gossip) leave the balancers within the profile's detection time instead
// of at their lease's end. cfg.Meta and cfg.Logger are set by the client.
func WithGossip(cfg gossip.Config) Option {
	return func(o *options) error {
		cfg.Meta = gossip.Meta{Role: gossip.RoleGateway}
		if err := cfg.Validate(); err != nil {
			return optionError("WithGossip: %w", err)
		}
		o.gossip = &cfg
		return nil
	}
}

// WithEventHook sets a function called with every valid event of a
// followed service before it is applied, for metrics such as the
// propagation lag (time.Since(e.At)). It runs on the NATS delivery
// goroutine: it must be quick and must not block.
func WithEventHook(f func(events.Event)) Option {
	return func(o *options) error {
		o.onEvent = f
		return nil
	}
}

// ListObserver is called after each change of a service's server list,
// with the list before and after it (the balancer's copies: read them, do
// not keep or modify them past the call). Changes of one service arrive one
// at a time and in order; those of different services may arrive
// concurrently. It runs on the goroutine that applies the change, so it
// must be quick and must not block: hand the work to another goroutine.
type ListObserver func(service string, old, new []*balancer.Server)

// WithListObserver sets a function told of every list change (see
// ListObserver), for dashboards and audit trails. Default: none.
func WithListObserver(f ListObserver) Option {
	return func(o *options) error {
		if f == nil {
			return optionError("WithListObserver: nil observer")
		}
		o.onList = f
		return nil
	}
}

// WithTransportOptions passes options to the Transport (lbhttp.WithObserver
// for metrics, lbhttp.WithTransportTemplate for TLS and pools,
// lbhttp.WithRetryOnStatus, lbhttp.WithLogger).
func WithTransportOptions(opts ...lbhttp.Option) Option {
	return func(o *options) error {
		o.transport = append(o.transport, opts...)
		return nil
	}
}

// WithProxyOptions passes options to the Handler's reverse proxy
// (lbhttp.WithRoutes, lbhttp.WithoutDefaultRoute, lbhttp.WithHints,
// lbhttp.WithPreserveHost, lbhttp.WithProxyLogger).
func WithProxyOptions(opts ...lbhttp.ProxyOption) Option {
	return func(o *options) error {
		o.proxy = append(o.proxy, opts...)
		return nil
	}
}

// apply runs every option and then the checks that span options, joining
// every problem into one error.
func (o *options) apply(opts []Option) error {
	var errs []error
	for i, opt := range opts {
		if opt == nil {
			errs = append(errs, optionError("option %d is nil", i))
			continue
		}
		if err := opt(o); err != nil {
			errs = append(errs, err)
		}
	}
	if o.balancers == nil {
		o.balancers = balancer.DefaultClientsConfig()
	}
	if o.zone != "" {
		applyZone(o.balancers, o.zone)
	}
	return errors.Join(errs...)
}

// applyZone makes zone the zone of the defaults and of every client that
// sets none of its own.
func applyZone(c *balancer.ClientsConfig, zone string) {
	if c.Defaults.Zone == "" {
		c.Defaults.Zone = zone
	}
	for name, cc := range c.Clients {
		if cc.Zone == "" {
			cc.Zone = zone
			c.Clients[name] = cc
		}
	}
}
