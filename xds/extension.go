package pushlbxds

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/app/gateway"
)

// Extension returns the gateway extension that serves xDS beside the
// proxy, over the gateway's client: it adds the flag -xds ADDR (empty, the
// default: off) and, when it is set, serves ADS on ADDR from the gateway's
// start to its shutdown, its counters (NewCollector's) on the gateway's
// /metrics. The build of the gateway with it is
// github.com/pushlb/pushlb/xds/cmd/gateway:
//
//	os.Exit(gateway.Main(os.Args[1:], os.Stdout, os.Stderr, pushlbxds.Extension()))
func Extension(opts ...Option) gateway.Extension {
	e := &extension{opts: opts}
	e.metrics = newCollector(e.srv.Load)
	return e
}

// The xDS server serves every service: a gateway running it follows all.
var _ gateway.WholeFleet = (*extension)(nil)

// extension is the gateway.Extension of Extension.
type extension struct {
	opts []Option
	addr string // -xds

	// srv is the server once started: scrapes read it from the admin
	// server's goroutines.
	srv     atomic.Pointer[Server]
	done    chan error // Serve's result
	metrics *collector
}

// Name implements gateway.Extension.
func (e *extension) Name() string { return "xds" }

// RegisterFlags implements gateway.Extension.
func (e *extension) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&e.addr, "xds", e.addr, "serve xDS (ADS: a Listener, RouteConfiguration, Cluster and ClusterLoadAssignment per service, for grpc-go's xds:/// and Envoy) on `address`; empty: off")
}

// WholeFleet implements gateway.WholeFleet: with -xds the server serves
// every service, so a gateway whose follow is not set follows all.
func (e *extension) WholeFleet() bool { return e.addr != "" }

// Start implements gateway.Extension: it listens on -xds and serves.
func (e *extension) Start(_ context.Context, c *pushlb.Client, log zerolog.Logger) error {
	if e.addr == "" {
		return nil
	}
	opts := append([]Option{WithLogger(log)}, e.opts...)
	srv, err := NewServer(c, opts...)
	if err != nil {
		return fmt.Errorf("xds: %w", err)
	}
	ln, err := net.Listen("tcp", e.addr)
	if err != nil {
		return fmt.Errorf("xds: -xds %s: %w", e.addr, err)
	}
	e.done = make(chan error, 1)
	e.srv.Store(srv)
	go func() { e.done <- srv.Serve(ln) }()
	log.Info().Str("address", ln.Addr().String()).Msg("xds: serving ADS")
	return nil
}

// Stop implements gateway.Extension: it stops the server and waits for it.
func (e *extension) Stop(ctx context.Context) error {
	srv := e.srv.Load()
	if srv == nil {
		return nil
	}
	srv.Stop()
	select {
	case err := <-e.done:
		if err != nil && !errors.Is(err, ErrStopped) {
			return fmt.Errorf("xds: %w", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("xds: stop: %w", ctx.Err())
	}
}

// Describe implements prometheus.Collector, through which the gateway
// serves the xDS counters on its /metrics.
func (e *extension) Describe(ch chan<- *prometheus.Desc) { e.metrics.Describe(ch) }

// Collect implements prometheus.Collector: nothing while xDS is off.
func (e *extension) Collect(ch chan<- prometheus.Metric) { e.metrics.Collect(ch) }

var (
	_ gateway.Extension    = (*extension)(nil)
	_ prometheus.Collector = (*extension)(nil)
)
