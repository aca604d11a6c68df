package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/dns"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/serverlist"
)

// Gateway is a running gateway: a pushlb.Client (the push path, its
// balancers and its reverse proxy) over a NATS connection, with the HTTP
// listeners, the admin endpoints, the metrics and, when asked, an embedded
// NATS server and demo backends. Build it with New, run it with Start, stop
// it with Shutdown.
type Gateway struct {
	cfg Config
	log zerolog.Logger

	metrics   *metrics
	embedded  *embeddedNATS
	nc        *nats.Conn
	natsWatch *natsWatch
	client    *pushlb.Client
	fleet     *convergence.Viewer // with FleetView
	dns       *dns.Server         // with DNS.Addr
	demo      *demo
	dash      *dashboard
	pending   []Extension // to start
	exts      []Extension // started, in order

	proxyLn, adminLn   net.Listener
	proxySrv, adminSrv *http.Server
	serveWG            sync.WaitGroup
	stopOnce           sync.Once
	started            bool // Start succeeded: Shutdown then logs "gateway stopped"
}

// New validates the configuration and builds a gateway without starting
// anything.
//
// The extensions, if any, start after the client and stop before it.
func New(cfg Config, log zerolog.Logger, exts ...Extension) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: log, pending: exts}
	g.metrics = newMetrics(g)
	g.dash = newDashboard(g)
	return g, nil
}

// Start connects (or starts the embedded NATS server), loads the registry's
// state into the balancers and starts serving. ctx bounds the start-up only.
func (g *Gateway) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			g.Shutdown(context.Background())
		}
	}()
	for _, k := range g.cfg.Balancer.IgnoredKeys {
		g.log.Warn().Str("key", k).Msg("Ribbon key ignored: pushlb does not use it (see docs/config.md)")
	}
	g.cfg.Gossip.WarnIgnored(g.log)
	nccfg := g.cfg.NATS.ForLease(g.cfg.Lease) // a short lease, short pings
	// Every address is checked before anything starts, so that a second
	// gateway on the same ports says so at once.
	checks := []listenCheck{{g.cfg.Listen, "-listen"}}
	if g.cfg.Admin != "off" {
		checks = append(checks, listenCheck{g.cfg.Admin, "-admin"})
	}
	if g.cfg.DNS.Addr != "" {
		checks = append(checks, listenCheck{g.cfg.DNS.Addr, "-dns"})
	}
	if nccfg.URL == "" {
		checks = append([]listenCheck{{g.cfg.EmbeddedNATS, "-embedded-nats"}}, checks...)
	}
	if err := checkListeners(checks...); err != nil {
		return err
	}
	if nccfg.URL == "" {
		if g.embedded, err = startEmbeddedNATS(g.cfg.EmbeddedNATS, g.cfg.DataDir, g.cfg.DataSync, g.cfg.Prefix, g.log); err != nil {
			return err
		}
		nccfg.URL = g.embedded.URL()
		g.log.Info().Str("url", nccfg.URL).Str("dataSync", g.embedded.policy.String()).Msg("embedded NATS server with JetStream started")
	}
	nccfg.Name = "pushlb-gateway"
	if g.nc, err = natsconn.Connect(ctx, nccfg, g.log); err != nil {
		return err
	}
	if g.cfg.Lease == 0 && nccfg.PingInterval == 0 {
		// The bucket's lease may be short for the default pings.
		if err := g.refitPings(ctx, nccfg); err != nil {
			return err
		}
	}
	g.natsWatch = watchNATS(g.nc)
	g.dash.start()
	g.metrics.reg.MustRegister(natsCollector{g.natsWatch})
	if g.client, err = pushlb.New(g.nc, g.clientConfig(), g.options()...); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if g.cfg.FleetView {
		// Before the client: its first report, sent as it starts, is
		// then in the view at once, not at its first heartbeat.
		if g.fleet, err = convergence.NewViewer(g.nc, convergence.ViewerConfig{Prefix: g.cfg.Prefix, Logger: g.log}); err != nil {
			return fmt.Errorf("gateway: fleet view: %w", err)
		}
		if err := g.fleet.Start(); err != nil {
			return fmt.Errorf("gateway: fleet view: %w", err)
		}
	}
	if err := g.client.Start(ctx); err != nil {
		return err
	}
	for _, x := range g.pending {
		if err := x.Start(ctx, g.client, g.log.With().Str("extension", x.Name()).Logger()); err != nil {
			return fmt.Errorf("gateway: %s: %w", x.Name(), err)
		}
		g.exts = append(g.exts, x)
		if m, ok := x.(prometheus.Collector); ok {
			if err := g.metrics.reg.Register(m); err != nil {
				return fmt.Errorf("gateway: %s: metrics: %w", x.Name(), err)
			}
		}
	}
	if g.cfg.DNS.Addr != "" {
		if err := g.startDNS(ctx); err != nil {
			return err
		}
	}
	if g.cfg.Demo {
		if g.demo, err = startDemo(ctx, g.nc, g.cfg, g.log); err != nil {
			return fmt.Errorf("gateway: demo: %w", err)
		}
	}
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: listen %s: %w", g.cfg.Listen, err)
	}
	limited := newLimitListener(ln, g.cfg.HTTP.MaxConns)
	g.proxyLn = limited
	g.metrics.reg.MustRegister(listenerCollector{limited})
	g.proxySrv = g.cfg.HTTP.server(g.client.Handler())
	g.serve(g.proxySrv, g.proxyLn)
	if g.cfg.Admin != "off" {
		if g.adminLn, err = net.Listen("tcp", g.cfg.Admin); err != nil {
			return fmt.Errorf("gateway: admin listen %s: %w", g.cfg.Admin, err)
		}
		g.adminSrv = g.cfg.HTTP.server(g.adminHandler())
		g.serve(g.adminSrv, g.adminLn)
	}
	g.log.Info().Str("listen", g.proxyLn.Addr().String()).Str("admin", g.AdminAddr()).Str("dns", g.DNSAddr()).Str("nats", g.nc.ConnectedUrl()).Msg("gateway started")
	g.started = true
	return nil
}

// clientConfig turns the configuration into the client's.
func (g *Gateway) clientConfig() pushlb.Config {
	c := g.cfg
	cc := pushlb.Config{
		Prefix:           c.Prefix,
		Zone:             c.Zone,
		Region:           c.Region,
		RegionPriority:   c.RegionPriority,
		Follow:           c.follow(wholeFleet(g.pending)),
		Services:         c.Subscriber.Services,
		IdleUnfollow:     c.IdleUnfollow,
		FollowTimeout:    c.FollowTimeout,
		Report:           c.Report,
		Lease:            c.Lease,
		RegistryReplicas: c.RegistryReplicas,
		Balancers:        c.Balancer.ClientsConfig,
		Coalesce:         c.Subscriber.Coalesce,
		AntiEntropy:      c.Subscriber.AntiEntropy,
		ServiceGrace:     c.ServiceGrace,
		// A bucket this gateway creates on its embedded server gets no
		// message schedules: with the server in the process, storing the
		// schedules costs more than the reaper saves (docs/protocol.md,
		// "The reaper by design").
		PlainLeases:   g.embedded != nil,
		EmptyListHold: c.EmptyListHold,
		Limits:        c.Limits,
		Reaper:        c.Reaper,
		RemoteRegions: c.RemoteRegions,
	}
	if c.Gossip.Enabled() {
		// Validate checked the settings.
		gc, _ := c.Gossip.Config(gossip.Meta{Role: gossip.RoleGateway}, g.log)
		cc.Gossip = &gc
	}
	return cc
}

// options returns the client's hooks and HTTP options.
func (g *Gateway) options() []pushlb.Option {
	c := g.cfg
	popts := []lbhttp.ProxyOption{lbhttp.WithSubsetObserver(g.metrics.observeSubset)}
	if len(c.Routes) > 0 {
		popts = append(popts, lbhttp.WithRoutes(c.Routes...))
	}
	if !c.defaultRoutes() {
		popts = append(popts, lbhttp.WithoutDefaultRoute())
	}
	if !c.Hints.IsZero() {
		popts = append(popts, lbhttp.WithHints(c.Hints))
	}
	return []pushlb.Option{
		pushlb.WithLogger(g.log),
		pushlb.WithEventHook(func(e events.Event) {
			g.metrics.observeEvent(e)
		}),
		pushlb.WithListObserver(func(lc pushlb.ListChange) {
			g.metrics.observeList(lc)
			g.dash.observe(lc)
		}),
		// WithInlineHTTP1: bodiless idempotent requests skip net/http's
		// per-connection goroutines (docs/perf/data-plane.md, "What the
		// gateway does differently, and why").
		pushlb.WithTransportOptions(lbhttp.WithObserver(g.dash.observer(g.metrics.observer())),
			lbhttp.WithRetryBudget(c.RetryBudget), lbhttp.WithInlineHTTP1()),
		pushlb.WithProxyOptions(popts...),
	}
}

// DemoInstructions returns the curl commands to try in demo mode, or "".
func (g *Gateway) DemoInstructions() string {
	if g.demo == nil {
		return ""
	}
	return g.demo.instructions(g.ProxyAddr(), g.AdminAddr())
}

// GossipAddr returns the gossip address, or "" with gossip off.
func (g *Gateway) GossipAddr() string {
	if g.client == nil {
		return ""
	}
	return g.client.GossipAddr()
}

func (g *Gateway) serve(srv *http.Server, ln net.Listener) {
	g.serveWG.Add(1)
	go func() {
		defer g.serveWG.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.log.Error().Err(err).Str("addr", ln.Addr().String()).Msg("serve")
		}
	}()
}

// NATSURL returns the URL of the NATS server in use (the embedded one when
// no URL was configured).
func (g *Gateway) NATSURL() string { return g.nc.ConnectedUrl() }

// ProxyAddr returns the proxy's listening address.
func (g *Gateway) ProxyAddr() string { return addrOf(g.proxyLn) }

// AdminAddr returns the admin listener's address, or "off".
func (g *Gateway) AdminAddr() string {
	if g.adminLn == nil {
		return "off"
	}
	return addrOf(g.adminLn)
}

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// Shutdown stops accepting requests, lets in-flight ones finish within
// ShutdownTimeout (or ctx), then stops the push path, the balancers and
// NATS. It is idempotent.
func (g *Gateway) Shutdown(ctx context.Context) error {
	var err error
	g.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, g.cfg.ShutdownTimeout)
		defer cancel()
		// The event streams end first: the admin server waits for them.
		g.dash.stop()
		for _, srv := range []*http.Server{g.proxySrv, g.adminSrv} {
			if srv != nil {
				if e := srv.Shutdown(ctx); e != nil {
					err = errors.Join(err, fmt.Errorf("gateway: shutdown: %w", e))
					srv.Close()
				}
			}
		}
		g.serveWG.Wait()
		if g.demo != nil {
			g.demo.stopAll()
		}
		for i := len(g.exts) - 1; i >= 0; i-- {
			if e := g.exts[i].Stop(ctx); e != nil {
				err = errors.Join(err, fmt.Errorf("gateway: %s: stop: %w", g.exts[i].Name(), e))
			}
		}
		if g.dns != nil {
			if e := g.dns.Close(ctx); e != nil {
				err = errors.Join(err, fmt.Errorf("gateway: %w", e))
			}
		}
		if g.fleet != nil {
			g.fleet.Close()
		}
		if g.client != nil {
			g.client.Close()
		}
		if g.natsWatch != nil {
			g.natsWatch.stop()
		}
		if g.nc != nil {
			g.nc.Close()
		}
		if g.embedded != nil {
			g.embedded.shutdown()
		}
		// A failed Start cleans up through here; its caller logs the
		// failure, and "stopped" would come first and mislead.
		if g.started {
			g.log.Info().Msg("gateway stopped")
		}
	})
	return err
}

// refitPings connects again, with pings fitted to it, when the registry
// bucket's lease (taken when none is configured) is short for the default
// pings (natsconn.Config.Refit).
func (g *Gateway) refitPings(ctx context.Context, nccfg natsconn.Config) error {
	fitted, ok := nccfg.Refit(bucketTTL(ctx, g.nc, g.cfg.Prefix))
	if !ok {
		return nil
	}
	g.nc.Close()
	g.log.Info().Dur("ping_interval", fitted.PingInterval).Msg("the registry's lease is short for the default pings: connecting again with pings fitted to it")
	var err error
	g.nc, err = natsconn.Connect(ctx, fitted, g.log)
	return err
}

// bucketTTL returns the lease of the registry bucket of prefix, 0 when it
// cannot be read (not created yet: this gateway creates it with its own).
func bucketTTL(ctx context.Context, nc *nats.Conn, prefix string) time.Duration {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, serverlist.BucketName(prefix))
	if err != nil {
		return 0
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return 0
	}
	return st.TTL()
}
