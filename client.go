package pushlb

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// registryScaleTimeout bounds the scale-up of the registry bucket. A server
// that refuses the update for want of permission never answers, so this is
// also how long a gateway without the permission waits before it says so.
const registryScaleTimeout = 10 * time.Second

// Client is the push path over one NATS connection: a balancer per service,
// rebuilt from the registry whenever an instance comes or goes, behind a
// Transport and a Handler. Build it with New, run it with Start, stop it
// with Close. See the package documentation for the lifecycle and the
// threading rules.
type Client struct {
	nc        *nats.Conn
	opts      options
	factory   *balancer.Factory
	guard     *subscriber.EmptyGuard // Config.EmptyListHold
	services  *lbvisitor.Services
	transport *lbhttp.Transport
	proxy     *lbhttp.Proxy

	mu    sync.Mutex // guards state and the parts below
	state clientState
	parts *parts
}

type clientState int

const (
	stateNew clientState = iota
	stateStarting
	stateStarted
	stateClosed
)

// parts are what Start builds; they are set once, when Start succeeds.
type parts struct {
	sub         *subscriber.Subscriber
	lookup      *serverlist.Lookup
	stopScaling func() // stops the bucket's scale-up (started last)
	gossip      *gossip.Node
	janitor     *lbvisitor.Janitor
	reaper      *serverlist.Reaper      // nil without Config.Reaper
	replicator  *serverlist.Replicator  // nil without Config.RemoteRegions
	regions     *serverlist.RegionWatch // nil without Config.Region
	reporter    *convergence.Reporter   // nil without Config.Report.ID
	failover    *failover               // leaves a server cut from its cluster (failover.go)
}

// New builds a client over nc with cfg (the zero Config is the default
// one) and opts. It checks every setting, builds the balancer factory, the
// Transport and the Handler, and starts nothing: no network call, no
// goroutine. Errors wrap ErrInvalidOption and name every bad field or
// option.
func New(nc *nats.Conn, cfg Config, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, optionError("nil NATS connection")
	}
	o, err := newOptions(cfg, opts)
	if err != nil {
		return nil, err
	}
	factory, err := balancer.NewFactory(o.Balancers, balancer.WithBalancerOptions(balancer.WithPanicListener(panicLogger(o.log))))
	if err != nil {
		return nil, optionError("balancer configuration: %w", err)
	}
	c := &Client{nc: nc, opts: o, factory: factory, guard: subscriber.NewEmptyGuard(o.EmptyListHold, o.Gossip != nil, o.log)}
	scfg := lbvisitor.ServicesConfig{Guard: c.guard, Observer: o.onList, Logger: o.log}
	if o.Follow == FollowRequested {
		scfg.Follower, scfg.FollowTimeout = clientFollower{c}, o.FollowTimeout
	}
	c.services = lbvisitor.NewServices(factory, scfg)
	topts := append([]lbhttp.Option{lbhttp.WithLogger(o.log)}, o.transport...)
	if c.transport, err = lbhttp.NewTransport(c.services.Balancers(), topts...); err != nil {
		return nil, optionError("WithTransportOptions: %w", err)
	}
	popts := append([]lbhttp.ProxyOption{lbhttp.WithProxyLogger(o.log)}, o.proxy...)
	if c.proxy, err = lbhttp.NewProxy(c.transport, popts...); err != nil {
		return nil, optionError("WithProxyOptions: %w", err)
	}
	return c, nil
}

// Start opens the registry bucket (creating it with the lease when it does
// not exist), builds the balancers the configuration names, subscribes to
// the change subjects and loads the registry's state into the balancers,
// then joins gossip when WithGossip was given. It returns once every
// registered instance is routable; ctx bounds the start only. A failed
// Start undoes what it did and leaves the client closed.
func (c *Client) Start(ctx context.Context) (err error) {
	c.mu.Lock()
	switch c.state {
	case stateStarting, stateStarted:
		c.mu.Unlock()
		return ErrStarted
	case stateClosed:
		c.mu.Unlock()
		return ErrClosed
	}
	c.state = stateStarting
	c.mu.Unlock()

	p, err := c.start(ctx)
	c.mu.Lock()
	closedMeanwhile := c.state == stateClosed
	if err == nil && !closedMeanwhile {
		c.state, c.parts = stateStarted, p
		c.mu.Unlock()
		return nil
	}
	c.state = stateClosed
	c.mu.Unlock()
	if p != nil {
		p.close()
	}
	c.closeRest()
	if err == nil {
		err = ErrClosed
	}
	return err
}

// start builds and starts the parts; on error it stops what it started.
func (c *Client) start(ctx context.Context) (_ *parts, err error) {
	o := c.opts
	js, err := jetstream.New(c.nc)
	if err != nil {
		return nil, fmt.Errorf("pushlb: jetstream: %w", err)
	}
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Prefix: o.Prefix, TTL: o.Lease, RequireTTL: o.Lease != 0, Replicas: o.RegistryReplicas, PlainLeases: o.PlainLeases, Logger: o.log})
	if err != nil {
		return nil, fmt.Errorf("pushlb: registry: %w", err)
	}
	warnSlowPings(c.nc, reg.Config().TTL, o.log)
	// A service the configuration names is served from the start, from its
	// static list if it has one, until the push path takes it over.
	for _, name := range o.configured() {
		if _, err := c.services.Follow(name); err != nil {
			return nil, fmt.Errorf("pushlb: balancer %q: %w", name, err)
		}
	}
	p := &parts{}
	p.sub, err = subscriber.New(c.nc, reg, c.services.Handle, subscriber.Config{
		Prefix: o.Prefix, Region: o.Region, Services: o.subscribed(), Scoped: o.Follow != FollowAll, Coalesce: o.Coalesce, AntiEntropy: o.AntiEntropy,
		Logger: o.log, OnEvent: c.onEvent,
		AdvisorySubject: o.advisorySubject(), ProbeTimeout: o.Advisories.ProbeTimeout,
		ConfirmWithin: o.Limits.ConfirmWithin, MaxUnconfirmed: o.Limits.UnconfirmedInstances,
		MaxServices: o.Limits.Services, MaxInstancesPerService: o.Limits.InstancesPerService,
	})
	if err != nil {
		return nil, fmt.Errorf("pushlb: subscriber: %w", err)
	}
	c.guard.Use(p.sub.Mirror(), nil)
	if p.lookup, err = serverlist.NewLookup(reg, p.sub.Mirror(), serverlist.LookupConfig{}); err != nil {
		return nil, fmt.Errorf("pushlb: lookup: %w", err)
	}
	c.services.Resolve(p.lookup) // the lookups read the subscriber's mirror
	waitFirst := c.services.TrackFirstLists()
	if err := p.sub.Start(ctx); err != nil {
		return nil, fmt.Errorf("pushlb: subscriber: %w", err)
	}
	// The subscriber delivers each service's first list on the service's
	// own goroutine; Start returns once every one was applied (or failed
	// and is being retried), so what the registry held is routable.
	if err := waitFirst(ctx, p.sub.Live()); err != nil {
		p.close()
		return nil, fmt.Errorf("pushlb: initial lists: %w", err)
	}
	if o.Gossip != nil {
		h := c.guard.GossipHandler(p.sub.GossipHandler(), p.sub.Reoffer)
		if p.gossip, err = startGossip(ctx, *o.Gossip, h, o); err != nil {
			p.close()
			return nil, err
		}
		c.guard.Use(p.sub.Mirror(), p.gossip)
	}
	p.janitor = lbvisitor.NewJanitor(c.services, lbvisitor.JanitorConfig{Grace: o.ServiceGrace, Idle: o.IdleUnfollow, Keep: o.configured(), Logger: o.log})
	p.janitor.Start()
	if o.Reaper {
		rcfg := serverlist.ReaperConfig{Logger: o.log}
		if o.Follow == FollowAll {
			// A scoped mirror does not hold every record: a scoped
			// client's reaper lists the records it sweeps, so that it
			// never reaps one it cannot see.
			rcfg.Mirror = p.sub.Mirror()
		}
		if len(o.RemoteRegions) > 0 {
			// Checked by New: Region and RemoteRegions are valid.
			p.replicator, _ = serverlist.NewReplicator(reg, serverlist.ReplicatorConfig{Region: o.Region, Remotes: o.RemoteRegions, Logger: o.log})
			rcfg.OnLead = p.replicator.Lead
		}
		p.reaper = serverlist.NewReaper(reg, rcfg)
		if err := p.reaper.Start(ctx); err != nil {
			p.close()
			return nil, fmt.Errorf("pushlb: reaper: %w", err)
		}
		p.sub.UseReleaser(p.reaper) // a crashed instance's ID is freed for its restart
	}
	if o.Report.ID != "" {
		p.reporter, err = convergence.NewReporter(c.nc, convergence.ReporterConfig{
			Prefix: o.Prefix, ID: o.Report.ID, Interval: o.Report.Interval, Source: p.applied, Logger: o.log,
		})
		if err != nil {
			p.close()
			return nil, fmt.Errorf("pushlb: report: %w", err)
		}
		p.reporter.Start()
	}
	if o.Region != "" {
		// Which other regions' copies are stale (docs/multiregion.md).
		p.regions = serverlist.WatchRegions(ctx, reg, 0, o.log)
	}
	p.stopScaling = reg.ScaleUpInBackground(registryScaleTimeout)
	p.failover = newFailover(c.nc, js, reg.Config().Bucket, o.log)
	p.failover.start()
	return p, nil
}

// configured are the services the configuration names: Config.Services
// and the services Config.Balancers names. They are followed from Start,
// whatever the requests, and never removed.
func (o options) configured() []string {
	names := append(slices.Clone(o.Services), o.Balancers.Names()...)
	slices.Sort(names)
	return slices.Compact(names)
}

// subscribed are the services the subscriber follows from Start: the
// configured ones, or none when it follows every service.
func (o options) subscribed() []string {
	if o.Follow == FollowAll {
		return nil
	}
	return o.configured()
}

// clientFollower follows services on request for the client's table,
// through its subscriber once started.
type clientFollower struct{ c *Client }

func (f clientFollower) Follow(ctx context.Context, service string) (bool, error) {
	p := f.c.started()
	if p == nil {
		return false, ErrNotStarted
	}
	return p.sub.Follow(ctx, service)
}

func (f clientFollower) MayHold(ctx context.Context, service string) (bool, error) {
	p := f.c.started()
	if p == nil {
		return false, ErrNotStarted
	}
	return p.sub.MayHold(ctx, service)
}

func (f clientFollower) Unfollow(service string) (bool, error) {
	p := f.c.started()
	if p == nil {
		return false, nil
	}
	return p.sub.Unfollow(service)
}

// advisorySubject is the subscriber's advisory subject: none when off.
func (o options) advisorySubject() string {
	if o.Advisories.Off {
		return ""
	}
	return o.Advisories.Subject
}

// startGossip joins the gossip cluster as a gateway with h: the
// subscriber's GossipHandler, which turns instance nodes that die or leave
// into offlines, accepting reports only from the node an instance's record
// names, wrapped by the empty-push guard's.
func startGossip(ctx context.Context, cfg gossip.Config, h gossip.Handler, o options) (*gossip.Node, error) {
	cfg.Logger = o.log
	n, err := gossip.New(cfg, h)
	if err != nil {
		return nil, fmt.Errorf("pushlb: %w", err) // gossip's errors say "gossip:"
	}
	if err := n.Start(ctx); err != nil {
		n.Close()
		return nil, fmt.Errorf("pushlb: %w", err) // gossip's errors say "gossip:"
	}
	o.log.Info().Str("gossip", n.LocalAddr()).Strs("join", cfg.Join).Str("profile", string(cfg.Profile)).Msg("gossip started")
	return n, nil
}

// applied returns what the client applied of each service delivered.
func (p *parts) applied() map[string]convergence.Applied {
	out := make(map[string]convergence.Applied)
	p.sub.AppliedAll(func(service string, a subscriber.Applied) {
		out[service] = convergence.Applied{Revision: a.Revision, Digest: a.Digest, At: a.At}
	})
	return out
}

// close stops the started parts in reverse order.
func (p *parts) close() {
	if p.failover != nil {
		p.failover.close()
	}
	if p.reporter != nil {
		p.reporter.Close()
	}
	if p.stopScaling != nil {
		p.stopScaling()
	}
	if p.reaper != nil {
		p.reaper.Close()
	}
	if p.regions != nil {
		p.regions.Close()
	}
	if p.janitor != nil {
		p.janitor.Close()
	}
	if p.gossip != nil {
		// No graceful leave: its broadcast waits for retransmissions (about
		// 1 s), and a gateway's departure changes nothing for its peers,
		// which act on instance nodes only; they mark it dead in time.
		p.gossip.Close()
	}
	if p.sub != nil {
		p.sub.Close()
	}
}

// Close stops gossip, the reaper (handing its lead over at once), the subscriber and
// the balancers' background work, and closes idle upstream connections. The
// balancers keep their last lists, so the Transport and Handler go on
// routing to them. It does not close the NATS connection. Close is
// idempotent; it always returns nil today, and returns an error for
// symmetry with the other Close methods.
func (c *Client) Close() error {
	c.mu.Lock()
	prev, p := c.state, c.parts
	c.state, c.parts = stateClosed, nil
	c.mu.Unlock()
	switch prev {
	case stateClosed:
		return nil
	}
	// The follows under way end first: they use the subscriber.
	c.services.Close()
	switch prev {
	case stateStarting:
		// Start sees the closed state when it ends and undoes its own work.
		return nil
	}
	if p != nil {
		p.close()
	}
	c.closeRest()
	return nil
}

// closeRest stops what New built.
func (c *Client) closeRest() {
	c.factory.Close()
	c.transport.CloseIdleConnections()
}

// Transport returns the client's http.RoundTripper: the host of a request's
// URL names the service ("http://orders/api/x"), and each attempt goes to
// an instance its balancer picks, with Ribbon's retries. See lbhttp.Transport.
func (c *Client) Transport() *lbhttp.Transport { return c.transport }

// Handler returns the client's reverse proxy: "/<service>/<rest>" goes to
// "/<rest>" on an instance of <service>, plus the routes given with
// WithProxyOptions. See lbhttp.Proxy for its answers to failures.
func (c *Client) Handler() http.Handler { return c.proxy }

// Balancer returns a read-only view of a service's balancer (see
// Balancer) at once, or an error wrapping ErrUnknownService when the
// client has none: the client does not follow the service (see
// Config.Follow), or nothing announced it. It never follows a service:
// Follow does.
func (c *Client) Balancer(service string) (Balancer, error) {
	if sv := c.services.Lookup(service); sv != nil {
		return Balancer{sv.Balancer()}, nil
	}
	return Balancer{}, fmt.Errorf("pushlb: no balancer for %q: %w", service, ErrUnknownService)
}

// Follow returns a read-only view of a service's balancer, following the
// service first when the client follows on request (FollowRequested) and
// does not follow it yet: it waits, within ctx and Config.FollowTimeout,
// for the registry's records of it and its first list. It counts as a
// request (see Config.IdleUnfollow). In the other modes it is Balancer.
// Errors wrap ErrUnknownService when the registry holds no instance of
// the service (remembered for 2 s), or when too many services are being
// followed at once; a follow that times out returns ctx's error.
func (c *Client) Follow(ctx context.Context, service string) (Balancer, error) {
	sv, err := c.services.Want(ctx, service)
	if errors.Is(err, lbvisitor.ErrUnknownService) {
		return Balancer{}, fmt.Errorf("pushlb: no balancer for %q: %w", service, err)
	}
	if err != nil {
		return Balancer{}, fmt.Errorf("pushlb: follow %q: %w", service, err)
	}
	return Balancer{sv.Balancer()}, nil
}

// GossipAddr returns the address of the client's gossip node, or "" when
// gossip is off or the client is not started.
func (c *Client) GossipAddr() string {
	if p := c.started(); p != nil && p.gossip != nil {
		return p.gossip.LocalAddr()
	}
	return ""
}

// FollowMode returns what the client follows (Config.Follow, its default
// resolved).
func (c *Client) FollowMode() FollowMode { return c.opts.Follow }

// Zone returns the zone the client runs in (Config.Zone), "" when none
// was set: the zone an adapter (the gRPC balancer) prefers by default.
func (c *Client) Zone() string { return c.opts.Zone }

// Region returns the region the client runs in and the other regions in
// failover order (Config.Region, Config.RegionPriority): what an adapter
// that orders localities itself (the xDS server) takes by default. The
// slice is the caller's own.
func (c *Client) Region() (region string, priority []string) {
	return c.opts.Region, slices.Clone(c.opts.RegionPriority)
}

// started returns the parts of a started client, or nil.
func (c *Client) started() *parts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parts
}

// Services returns the names of the services the client has a balancer
// for, sorted.
func (c *Client) Services() []string { return c.services.Names() }

// panicLogger logs a balancer's entry into panic and its exit
// (balancer.Config.PanicThreshold).
func panicLogger(log zerolog.Logger) balancer.PanicListener {
	return func(b *balancer.Balancer, panic bool, healthy, alive int) {
		if panic {
			log.Warn().Str("service", b.Name()).Int("healthy", healthy).Int("alive", alive).
				Float64("threshold_percent", b.Config().PanicThreshold).
				Msg("panic: too few healthy servers, balancing over all of them")
			return
		}
		log.Info().Str("service", b.Name()).Int("healthy", healthy).Int("alive", alive).Msg("panic over")
	}
}

// onEvent is the subscriber's OnEvent: an offline event ends a hold of its
// service (subscriber.EmptyGuard.Offline), then the caller's WithOnEvent
// sees it.
func (c *Client) onEvent(ev events.Event) {
	if ev.Kind == events.Offline {
		c.guard.Offline(ev.Service)
	}
	if c.opts.onEvent != nil {
		c.opts.onEvent(ev)
	}
}
