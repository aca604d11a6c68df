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
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/natsconn"
	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// Gateway is a running gateway. Build it with New, run it with Start, stop
// it with Shutdown.
type Gateway struct {
	cfg Config
	log zerolog.Logger

	embedded *embeddedNATS
	nc       *nats.Conn
	reg      *serverlist.Registry
	factory  *balancer.Factory
	bals     *balancers
	sub      *subscriber.Subscriber
	lookup   *serverlist.Lookup
	visitors *lbvisitor.Registry
	metrics  *metrics
	proxy    *proxy
	demo     *demo
	gossip   *gossip.Node

	proxyLn, adminLn   net.Listener
	proxySrv, adminSrv *http.Server
	serveWG            sync.WaitGroup
	stopOnce           sync.Once
}

// New validates the configuration and builds a gateway without starting
// anything.
func New(cfg Config, log zerolog.Logger) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	clients := cfg.Balancer.Clone()
	if cfg.Zone != "" {
		// The gateway's zone is every client's zone unless it sets its own.
		if clients.Defaults.Zone == "" {
			clients.Defaults.Zone = cfg.Zone
		}
		for name, c := range clients.Clients {
			if c.Zone == "" {
				c.Zone = cfg.Zone
				clients.Clients[name] = c
			}
		}
	}
	factory, err := balancer.NewFactory(clients)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	g := &Gateway{cfg: cfg, log: log, factory: factory}
	g.bals = newBalancers(factory, log)
	g.metrics = newMetrics(g)
	g.bals.onNew = g.metrics.initService
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
	url := g.cfg.NATS.URL
	if url == "" {
		if g.embedded, err = startEmbeddedNATS(g.cfg.EmbeddedNATS, g.cfg.DataDir); err != nil {
			return err
		}
		url = g.embedded.URL()
		g.log.Info().Str("url", url).Msg("embedded NATS server with JetStream started")
	}
	nccfg := natsconn.Config{
		URL: url, Name: "pushlb-gateway", CredsFile: g.cfg.NATS.CredsFile, User: g.cfg.NATS.User,
		Password: g.cfg.NATS.Password, Token: g.cfg.NATS.Token,
		TLSCA: g.cfg.NATS.TLS.CA, TLSCert: g.cfg.NATS.TLS.Cert, TLSKey: g.cfg.NATS.TLS.Key,
	}
	if g.nc, err = natsconn.Connect(ctx, nccfg, g.log); err != nil {
		return err
	}
	js, err := jetstream.New(g.nc)
	if err != nil {
		return fmt.Errorf("gateway: jetstream: %w", err)
	}
	if g.reg, err = serverlist.Open(ctx, js, serverlist.RegistryConfig{Prefix: g.cfg.Prefix, TTL: g.cfg.Lease, Logger: g.log}); err != nil {
		return fmt.Errorf("gateway: registry: %w", err)
	}
	g.sub, err = subscriber.New(g.nc, g.reg, g.handle, subscriber.Config{
		Prefix: g.cfg.Prefix, Services: g.cfg.Subscriber.Services, Coalesce: g.cfg.Subscriber.Coalesce,
		AntiEntropy: g.cfg.Subscriber.AntiEntropy, Logger: g.log, OnEvent: g.metrics.observeEvent,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if g.lookup, err = serverlist.NewLookup(g.reg, g.sub.Mirror(), serverlist.LookupConfig{}); err != nil {
		return err
	}
	g.visitors = lbvisitor.NewRegistry(g.bals, g.lookup, g.log)
	if err := g.sub.Start(ctx); err != nil {
		return err
	}
	if g.cfg.Gossip.Enabled() {
		if err := g.startGossip(ctx); err != nil {
			return err
		}
	}
	if g.proxy, err = newProxy(g); err != nil {
		return err
	}
	if g.cfg.Demo {
		if g.demo, err = startDemo(ctx, g.nc, g.reg, g.log); err != nil {
			return fmt.Errorf("gateway: demo: %w", err)
		}
	}
	if g.proxyLn, err = net.Listen("tcp", g.cfg.Listen); err != nil {
		return fmt.Errorf("gateway: listen %s: %w", g.cfg.Listen, err)
	}
	g.proxySrv = &http.Server{Handler: g.proxy, ReadHeaderTimeout: 10 * time.Second}
	g.serve(g.proxySrv, g.proxyLn)
	if g.cfg.Admin != "off" {
		if g.adminLn, err = net.Listen("tcp", g.cfg.Admin); err != nil {
			return fmt.Errorf("gateway: admin listen %s: %w", g.cfg.Admin, err)
		}
		g.adminSrv = &http.Server{Handler: g.adminHandler(), ReadHeaderTimeout: 10 * time.Second}
		g.serve(g.adminSrv, g.adminLn)
	}
	g.log.Info().Str("listen", g.proxyLn.Addr().String()).Str("admin", g.AdminAddr()).Str("nats", url).Msg("gateway started")
	return nil
}

// DemoInstructions returns the curl commands to try in demo mode, or "".
func (g *Gateway) DemoInstructions() string {
	if g.demo == nil {
		return ""
	}
	return g.demo.instructions(g.ProxyAddr(), g.AdminAddr())
}

// startGossip joins the gossip cluster as a gateway: an instance node
// declared dead, or leaving, is an offline for its incarnation; one that
// comes back (a refuted suspicion) is restored.
func (g *Gateway) startGossip(ctx context.Context) error {
	cfg, err := g.cfg.Gossip.Config(gossip.Meta{Role: gossip.RoleGateway}, g.log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	instance := func(m gossip.Member) bool { return m.Meta.Role == gossip.RoleInstance }
	g.gossip, err = gossip.Start(ctx, cfg, gossip.HandlerFuncs{
		Alive: func(m gossip.Member) {
			if instance(m) {
				g.sub.GossipAlive(m.Meta.Service, m.Meta.InstanceID, m.Meta.Incarnation)
			}
		},
		Gone: func(m gossip.Member, reason gossip.Reason) {
			if instance(m) {
				g.log.Info().Str("node", m.Name).Str("addr", m.Addr).Str("reason", string(reason)).Msg("gossip: instance gone")
				g.sub.GossipGone(m.Meta.Service, m.Meta.InstanceID, m.Meta.Incarnation)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("gateway: gossip: %w", err)
	}
	g.log.Info().Str("gossip", g.gossip.LocalAddr()).Strs("join", cfg.Join).Str("profile", string(cfg.Profile)).Msg("gossip started")
	return nil
}

// GossipAddr returns the gossip address, or "" with gossip off.
func (g *Gateway) GossipAddr() string {
	if g.gossip == nil {
		return ""
	}
	return g.gossip.LocalAddr()
}

// handle is the subscriber's handler: the push path's rebuild of one
// service's balancer.
func (g *Gateway) handle(ctx context.Context, lc events.ListChanged) error {
	return g.visitors.Handle(ctx, lc)
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
		if g.gossip != nil {
			g.gossip.Leave(time.Second)
			g.gossip.Shutdown()
		}
		if g.sub != nil {
			g.sub.Stop()
		}
		if g.proxy != nil {
			g.proxy.close()
		}
		g.factory.Close()
		if g.nc != nil {
			g.nc.Close()
		}
		if g.embedded != nil {
			g.embedded.shutdown()
		}
		g.log.Info().Msg("gateway stopped")
	})
	return err
}
