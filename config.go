package pushlb

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// Config is what a Client follows and how it keeps its lists: the settings
// a deployment writes down (the gateway's YAML maps onto it field by
// field). Hooks and the HTTP layer's own options are Options of New.
//
// The zero value is the default configuration. In every field, zero means
// the default that DefaultConfig shows; a negative or out-of-range value is
// an error of New, wrapping ErrInvalidOption and naming the field
// ("Config.Lease: 1ms is below the minimum 1s"). DefaultConfig is the one
// place the defaults are written; docs/embedding.md is tested against it.
type Config struct {
	// Prefix is the NATS subject prefix of the deployment: events travel on
	// <Prefix>.svc.<service>.online|offline and the registry bucket is
	// named after it. Default "lb".
	Prefix string
	// Zone is the zone this process runs in: the zone filters of every
	// balancer whose configuration names no zone of its own prefer it.
	// Default none.
	Zone string
	// Region is the region this process runs in, and RegionPriority the
	// other regions in the order it fails over to them: the defaults of
	// every balancer whose configuration names no region of its own
	// (balancer.Config's Region and RegionPriority: picks go to the
	// nearest region with a reachable instance; instances carry their
	// region in their records, announce -region). Default none: regions
	// are ignored.
	Region         string
	RegionPriority []string
	// Follow is what the client follows (mirrors the records of, receives
	// the events of, holds a balancer for; docs/embedding.md, "What a
	// client follows"):
	//   - FollowAll: every service announced under Prefix. For what needs
	//     every service: the xDS server, a dashboard of the whole fleet.
	//   - FollowListed: Services and the services Balancers names, no
	//     other. Requests for another service are unknown.
	//   - FollowRequested: those, and each service requests ask for
	//     (Client.Follow, the Transport, the Handler, the adapters), from
	//     the first request, which waits for its first list (at most
	//     FollowTimeout); unfollowed once no request asked for it during
	//     IdleUnfollow. Memory, start-up and CPU then grow with the
	//     services routed, not with the fleet.
	// Default: FollowRequested.
	Follow FollowMode
	// Services are services always followed (see Follow); with FollowAll
	// it must be empty.
	Services []string
	// IdleUnfollow is how long a service followed on request stays
	// followed without a request (FollowRequested). Default 10 min.
	IdleUnfollow time.Duration
	// FollowTimeout bounds the wait of the first request for a service not
	// followed yet (FollowRequested): the registry's records of it loaded
	// and its first list installed. Default 5 s.
	FollowTimeout time.Duration
	// Lease is the registry lease (the bucket's TTL). The bucket holds it:
	// zero, the default, takes the bucket's, or 30 s (serverlist.DefaultTTL)
	// when this client creates the bucket. A lease set here creates the
	// bucket with it, and Start fails (wrapping serverlist.ErrLeaseMismatch)
	// when an existing bucket has another: the bucket belongs to the
	// deployment, and a lease set on purpose is not ignored without a word.
	// At least 1 s.
	Lease time.Duration
	// RegistryReplicas is the replicas of the registry bucket (1 to 5):
	// those it gets when the client creates it, and the count Start raises
	// an existing bucket with fewer to (in the background, logged; never
	// lowered; a user without the permission gets a warning). Default 0:
	// min(3, the JetStream servers of the cluster).
	RegistryReplicas int
	// Balancers holds the balancer settings: global defaults and
	// per-service overrides (rule, zone filter, breaker, retries, timeouts),
	// as balancer/lbconfig loads them from YAML or Ribbon .properties.
	// Services it names get a balancer at Start, so a static listOfServers
	// works before anything is announced. New copies it. Default (nil):
	// balancer.DefaultConfig for every service.
	Balancers *balancer.ClientsConfig
	// Coalesce is the least time between two rebuilds of one service's
	// balancer; the first change after a quiet period applies at once.
	// Default 10 ms.
	Coalesce time.Duration
	// AntiEntropy is the interval of full reconciliations with the
	// registry. Default 60 s.
	AntiEntropy time.Duration
	// ServiceGrace is how long the balancer of a service with no instance
	// left is kept: once its list has been empty and no request named it
	// for that long, it is removed with its stats, unless Balancers names
	// the service. A later announcement builds it again. Default 5 min.
	ServiceGrace time.Duration
	// EmptyListHold protects the lists from a registry that loses
	// everything at once (its bucket deleted or purged): a change that
	// would empty a service, every instance it removes removed because the
	// registry no longer holds it (none announced offline, none found dead
	// by gossip or a disconnect advisory), is held back and the last list
	// kept, logged and counted (ServiceStats.Held), when the service had
	// two or more instances removed within a second, or, with Gossip, when
	// the gossip node a removed instance's record named is alive (one
	// instance is enough then). The hold ends when the registry shows the
	// service's instances again, when gossip finds every held instance's
	// node gone, or after this long. A real mass offline (each instance
	// announcing it) still empties the list at once, also when the
	// registry's removals reach the client before the offline events. Default 2 min;
	// negative turns the protection off (docs/balancer.md, "Empty-push
	// protection").
	EmptyListHold time.Duration
	// Limits bound what announcements alone can make the client hold.
	Limits Limits
	// PlainLeases makes a registry bucket this client creates carry no
	// message schedules: the leading reaper then receives every lease
	// renewal instead of one expiry message per lease that ends. For a
	// process that embeds the NATS server, where storing the schedules
	// costs more than the reaper saves (docs/protocol.md, "The reaper by
	// design"); the gateway sets it when it runs its embedded server. An
	// existing bucket is never changed. Default false.
	PlainLeases bool
	// Reaper makes the client take part in the election of the registry's
	// reaper, which removes the record of an instance whose lease ended (a
	// crash that gossip did not report first). Of the processes that take
	// part, one leads and alone receives the leases' expiry messages (the
	// renewals, on a bucket without message schedules); one
	// whose NATS user may not write the reaper's lock logs it once and
	// stays out. Default false: a program that only routes does not reap.
	// The gateway binary turns it on; a deployment needs at least one
	// reaper (docs/protocol.md, section 4; docs/security.md).
	Reaper bool
	// RemoteRegions are the other regions whose registries this region's
	// registry holds copies of (docs/multiregion.md): while this client's
	// reaper leads, it copies their records into the registry
	// (serverlist.Replicator), read-only, under their region and a
	// qualified ID ("<id>@<region>"), where every client of the region
	// reads them like its own. Every reaper of a region should list the
	// same regions: the one that leads removes the copies of regions it
	// does not list. Needs Region and Reaper. Default none.
	RemoteRegions []serverlist.RemoteRegion
	// Advisories configures crash detection by the NATS server's
	// client-disconnect advisories: a crashed instance leaves the balancers
	// within milliseconds, where its server and account publish and import
	// them (docs/protocol.md, "Crash detection"). On by default; without
	// advisories the client logs once that it falls back to gossip and
	// leases, and works as before.
	Advisories Advisories
	// Report, when its ID is set, makes the client publish what it has
	// applied of each service it follows (the registry revision its list
	// reflects, and when) on <Prefix>.report.<ID>, at most once per
	// interval, for a fleet view (convergence.Viewer, the gateway's
	// /-/fleet): docs/protocol.md, "Convergence reports". Default: off.
	Report ReportConfig
	// Gossip, when set, makes the client a gossip (memberlist) member with
	// the gateway role, so crashed instances that joined the same cluster
	// (announce -gossip) leave the balancers within the profile's detection
	// time instead of at their lease's end. Its Meta and Logger are set by
	// the client. Default nil: off.
	Gossip *gossip.Config
}

// Limits bound what announcements alone (events, without a registry
// record) can make a client hold. Instances the registry holds are always
// followed: the registry is access-controlled, the bus may not be. Events
// beyond a limit are dropped and counted (Stats.Events.Dropped["limit"]).
// Zero fields take the defaults; negative ones are invalid.
type Limits struct {
	// UnconfirmedInstances bounds the instances known only from events, at
	// any moment. Default 10,000.
	UnconfirmedInstances int `yaml:"unconfirmedInstances"`
	// Services and InstancesPerService bound the services, and the
	// instances of one service, that events may add. Default 10,000 each.
	Services            int `yaml:"services"`
	InstancesPerService int `yaml:"instancesPerService"`
	// ConfirmWithin is how long an instance known only from events waits
	// for the registry to show it before it is forgotten. Default 5 s.
	ConfirmWithin time.Duration `yaml:"confirmWithin"`
}

// Advisories configure crash detection by client-disconnect advisories.
// An advisory that names the NATS connection of an instance's record
// starts a probe of the instance (a TCP connect to its gossip node, else to
// its address): refused or unreachable, it is removed at once; answering,
// it is kept (the connection blipped, and the instance re-announces on its
// new one).
type Advisories struct {
	// Off turns the detection off: no subscription, no probe. Default
	// false.
	Off bool `yaml:"off"`
	// Subject is where the deployment imports its account's advisories
	// ($SYS.ACCOUNT.<account>.DISCONNECT). Default "<Prefix>.advisory.disconnect"
	// (events.DisconnectAdvisorySubject).
	Subject string `yaml:"subject"`
	// ProbeTimeout bounds one connect of a probe; a probe that times out
	// finds the instance unreachable. Default 250 ms.
	ProbeTimeout time.Duration `yaml:"probeTimeout"`
}

// ReportConfig configures a client's convergence reports (Config.Report).
type ReportConfig struct {
	// ID names the client in its reports: one subject token of
	// [A-Za-z0-9_-]. Empty: no reports.
	ID string `yaml:"id"`
	// Interval is the least time between two reports (one goes out when
	// something was applied since the last, and every 10 intervals
	// regardless). Default 1 s; at least 100 ms.
	Interval time.Duration `yaml:"interval"`
}

// FollowMode says what a client follows (Config.Follow).
type FollowMode string

// The follow modes.
const (
	FollowAll       FollowMode = "all"
	FollowListed    FollowMode = "listed"
	FollowRequested FollowMode = "requested"
)

// DefaultIdleUnfollow is Config.IdleUnfollow's default.
const DefaultIdleUnfollow = 10 * time.Minute

// DefaultServiceGrace is Config.ServiceGrace's default.
const DefaultServiceGrace = 5 * time.Minute

// DefaultEmptyListHold is Config.EmptyListHold's default.
const DefaultEmptyListHold = 2 * time.Minute

// DefaultConfig returns the configuration that the zero Config means, with
// every default written out.
func DefaultConfig() Config {
	return Config{
		Prefix:        events.DefaultPrefix,
		Balancers:     balancer.DefaultClientsConfig(),
		Coalesce:      subscriber.DefaultCoalesce,
		AntiEntropy:   subscriber.DefaultAntiEntropy,
		ServiceGrace:  DefaultServiceGrace,
		EmptyListHold: DefaultEmptyListHold,
		IdleUnfollow:  DefaultIdleUnfollow,
		Report:        ReportConfig{Interval: convergence.DefaultInterval},
		FollowTimeout: lbvisitor.DefaultFollowTimeout,
		Limits: Limits{
			UnconfirmedInstances: subscriber.DefaultMaxUnconfirmed,
			Services:             subscriber.DefaultMaxServices,
			InstancesPerService:  subscriber.DefaultMaxInstancesPerService,
			ConfirmWithin:        subscriber.DefaultConfirmWithin,
		},
		Advisories: Advisories{
			Subject:      events.DisconnectAdvisorySubject(events.DefaultPrefix),
			ProbeTimeout: subscriber.DefaultProbeTimeout,
		},
	}
}

// resolve checks c and returns it with its zero fields set to their
// defaults and what it holds by reference copied. Every problem is
// reported, joined into one error.
// Validate reports what New would refuse in c, without a connection and
// without building anything: errors wrap ErrInvalidOption and name every
// bad field. For a host that checks its configuration before it connects
// (the Caddy module's Validate).
func (c Config) Validate() error {
	o, err := newOptions(c, nil)
	if err != nil {
		return err
	}
	if _, err := balancer.NewFactory(o.Balancers); err != nil {
		return optionError("balancer configuration: %w", err)
	}
	return nil
}

func (c Config) resolve() (Config, error) {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, optionError("Config."+field+": "+format, a...))
	}
	def := DefaultConfig()
	orDefault := func(field string, v *time.Duration, d time.Duration) {
		switch {
		case *v < 0:
			bad(field, "negative duration %v", *v)
		case *v == 0:
			*v = d
		}
	}
	if c.Prefix == "" {
		c.Prefix = def.Prefix
	} else if err := events.ValidatePrefix(c.Prefix); err != nil {
		bad("Prefix", "%w", err)
	}
	for _, s := range c.Services {
		if err := events.ValidateService(s); err != nil {
			bad("Services", "%w", err)
		}
	}
	c.Services = append([]string(nil), c.Services...)
	switch c.Follow {
	case "":
		c.Follow = FollowRequested
	case FollowAll:
		if len(c.Services) > 0 {
			bad("Services", "%v: follow all follows every service; list services with follow listed or requested", c.Services)
		}
	case FollowListed, FollowRequested:
	default:
		bad("Follow", "%q: all, listed or requested", c.Follow)
	}
	orDefault("IdleUnfollow", &c.IdleUnfollow, def.IdleUnfollow)
	orDefault("Report.Interval", &c.Report.Interval, def.Report.Interval)
	if c.Report.Interval < convergence.MinInterval {
		bad("Report.Interval", "%v is below %v", c.Report.Interval, convergence.MinInterval)
	}
	if c.Report.ID != "" {
		if err := convergence.ValidateID(c.Report.ID); err != nil {
			bad("Report.ID", "%w", err)
		}
	}
	orDefault("FollowTimeout", &c.FollowTimeout, def.FollowTimeout)
	if c.Lease != 0 && c.Lease < serverlist.MinTTL {
		bad("Lease", "%v is below the minimum %v (0: the bucket's)", c.Lease, serverlist.MinTTL)
	}
	if c.RegistryReplicas < 0 || c.RegistryReplicas > serverlist.MaxReplicas {
		bad("RegistryReplicas", "%d: 1 to %d, or 0 for min(3, the cluster's JetStream servers)", c.RegistryReplicas, serverlist.MaxReplicas)
	}
	if c.Balancers == nil {
		c.Balancers = def.Balancers
	} else if err := c.Balancers.Validate(); err != nil {
		bad("Balancers", "%w", err)
	} else {
		c.Balancers = c.Balancers.Clone()
	}
	orDefault("Coalesce", &c.Coalesce, def.Coalesce)
	orDefault("AntiEntropy", &c.AntiEntropy, def.AntiEntropy)
	orDefault("ServiceGrace", &c.ServiceGrace, def.ServiceGrace)
	if c.EmptyListHold == 0 {
		c.EmptyListHold = def.EmptyListHold // negative: off
	}
	orDefault("Limits.ConfirmWithin", &c.Limits.ConfirmWithin, def.Limits.ConfirmWithin)
	orDefault("Advisories.ProbeTimeout", &c.Advisories.ProbeTimeout, def.Advisories.ProbeTimeout)
	if c.Advisories.Subject == "" {
		// The default follows the prefix.
		c.Advisories.Subject = events.DisconnectAdvisorySubject(c.Prefix)
	} else if err := events.ValidatePrefix(c.Advisories.Subject); err != nil {
		bad("Advisories.Subject", "dot-separated tokens of [A-Za-z0-9_-]: %w", err)
	}
	for _, l := range []struct {
		field string
		v     *int
		def   int
	}{
		{"Limits.UnconfirmedInstances", &c.Limits.UnconfirmedInstances, def.Limits.UnconfirmedInstances},
		{"Limits.Services", &c.Limits.Services, def.Limits.Services},
		{"Limits.InstancesPerService", &c.Limits.InstancesPerService, def.Limits.InstancesPerService},
	} {
		switch {
		case *l.v < 0:
			bad(l.field, "negative limit %d", *l.v)
		case *l.v == 0:
			*l.v = l.def
		}
	}
	if c.Gossip != nil {
		g := *c.Gossip
		g.Meta = gossip.Meta{Role: gossip.RoleGateway}
		if err := g.Validate(); err != nil {
			bad("Gossip", "%w", err)
		}
		c.Gossip = &g
	}
	if c.Region == "" && len(c.RegionPriority) > 0 {
		bad("RegionPriority", "%v without a Region", c.RegionPriority)
	}
	if len(c.RemoteRegions) > 0 {
		rc := serverlist.ReplicatorConfig{Region: c.Region, Remotes: c.RemoteRegions}
		switch err := rc.Validate(); {
		case err != nil:
			bad("RemoteRegions", "%w", err)
		case !c.Reaper:
			bad("RemoteRegions", "the copies are made by the leading reaper: needs Reaper")
		}
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	if c.Zone != "" {
		applyZone(c.Balancers, c.Zone)
	}
	if c.Region != "" {
		applyRegion(c.Balancers, c.Region, c.RegionPriority)
	}
	unset := func(name string) error {
		return fmt.Errorf("%w: Balancers: %s: regionPriority or localRegionOnly without a region (Config.Region, or the balancer's own)", ErrInvalidOption, name)
	}
	if c.Balancers.Defaults.RegionsUnset() {
		return c, unset("defaults")
	}
	for _, name := range c.Balancers.Names() {
		if cc := c.Balancers.Clients[name]; cc.RegionsUnset() {
			return c, unset(name)
		}
	}
	return c, nil
}

// applyRegion makes region and priority those of the defaults and of
// every client that sets no region of its own.
func applyRegion(c *balancer.ClientsConfig, region string, priority []string) {
	set := func(cc *balancer.Config) {
		if cc.Region == "" {
			cc.Region, cc.RegionPriority = region, slices.Clone(priority)
		}
	}
	set(&c.Defaults)
	for name, cc := range c.Clients {
		set(&cc)
		c.Clients[name] = cc
	}
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
