package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// DemoService is the service name of the demo backends.
const DemoService = "demo"

// demoZones are the zones of the demo backends, one backend each.
var demoZones = [...]string{"a", "a", "b"}

// demoBackends is the number of demo backends.
const demoBackends = len(demoZones)

// demo runs local backends in two zones that announce themselves, so a
// newcomer sees balancing and live removal with nothing else installed.
type demo struct {
	nc  *nats.Conn
	reg *serverlist.Registry
	log zerolog.Logger

	mu       sync.Mutex
	backends map[string]*demoBackend
	order    []string
}

type demoBackend struct {
	name, zone string
	port       int
	srv        *http.Server
	pub        *publisher.Publisher
}

func startDemo(ctx context.Context, nc *nats.Conn, cfg Config, log zerolog.Logger) (*demo, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Prefix: cfg.Prefix, TTL: cfg.Lease, Logger: log})
	if err != nil {
		return nil, err
	}
	d := &demo{nc: nc, reg: reg, log: log, backends: map[string]*demoBackend{}}
	for i, zone := range demoZones {
		name := fmt.Sprintf("demo-%d", i+1)
		d.backends[name] = &demoBackend{name: name, zone: zone}
		if cfg.DemoPort > 0 {
			d.backends[name].port = cfg.DemoPort + i
		}
		d.order = append(d.order, name)
		if err := d.start(ctx, name); err != nil {
			d.stopAll()
			return nil, err
		}
	}
	return d, nil
}

// start serves and announces one backend (again, after a stop: on the same
// port when it is free, with a new incarnation).
func (d *demo) start(ctx context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.backends[name]
	if b == nil {
		return fmt.Errorf("no demo backend %q", name)
	}
	if b.srv != nil {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)))
	if err != nil {
		return fmt.Errorf("demo backend %s: %w", name, err)
	}
	b.port = ln.Addr().(*net.TCPAddr).Port
	b.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s (zone %s), path %s\n", name, b.zone, r.URL.Path)
	}), ReadHeaderTimeout: 5 * time.Second}
	go b.srv.Serve(ln)
	pub, err := publisher.New(d.nc, d.reg, publisher.Config{})
	if err != nil {
		return err
	}
	in := serverlist.Instance{Service: DemoService, InstanceID: fmt.Sprintf("127.0.0.1:%s:%d", DemoService, b.port),
		Host: "127.0.0.1", Port: b.port, Zone: b.zone, Metadata: map[string]string{"name": name}}
	if err := pub.Announce(ctx, in); err != nil {
		b.srv.Close()
		b.srv = nil
		return err
	}
	b.pub = pub
	d.log.Info().Str("backend", name).Str("zone", b.zone).Int("port", b.port).Msg("demo backend announced")
	return nil
}

// stop withdraws one backend (offline first, so gateways stop sending),
// then shuts it down.
func (d *demo) stop(ctx context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.backends[name]
	if b == nil {
		return fmt.Errorf("no demo backend %q", name)
	}
	if b.srv == nil {
		return nil
	}
	err := b.pub.Withdraw(ctx, "demo stop")
	b.pub.Close()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	b.srv.Shutdown(sctx)
	b.srv, b.pub = nil, nil
	d.log.Info().Str("backend", name).Msg("demo backend withdrawn and stopped")
	return err
}

func (d *demo) stopAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range d.order {
		if err := d.stop(ctx, name); err != nil {
			d.log.Warn().Err(err).Str("backend", name).Msg("demo stop")
		}
	}
}

func (d *demo) serveStop(w http.ResponseWriter, r *http.Request)  { d.serve(w, r, d.stop, "stopped") }
func (d *demo) serveStart(w http.ResponseWriter, r *http.Request) { d.serve(w, r, d.start, "started") }

func (d *demo) serve(w http.ResponseWriter, r *http.Request, op func(context.Context, string) error, done string) {
	name := r.PathValue("name")
	if err := op(r.Context(), name); err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, context.Canceled) {
			code = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), code)
		return
	}
	fmt.Fprintf(w, "%s %s\n", name, done)
}

// instructions are printed at start in demo mode.
func (d *demo) instructions(proxy, admin string) string {
	return fmt.Sprintf(`
pushlb demo: three backends of service %[3]q (demo-1 and demo-2 in zone a, demo-3 in zone b)
announce themselves; the gateway balances over them.

  for i in $(seq 30); do curl -s http://%[1]s/demo/hello; done | sort | uniq -c   # answers per backend: all three
  curl -s http://%[2]s/-/lb                          # the balancers (JSON; open it in a browser for HTML)
  curl -s -X POST http://%[2]s/-/demo/stop/demo-2    # demo-2 announces offline and stops
  for i in $(seq 30); do curl -s http://%[1]s/demo/hello; done | sort | uniq -c   # demo-1 and demo-3 only, from the first request
  curl -s -X POST http://%[2]s/-/demo/start/demo-2   # back, with a new incarnation
  curl -s http://%[2]s/metrics | grep pushlb_        # Prometheus metrics

Press Ctrl-C to stop the gateway and its demo backends.
`, proxy, admin, DemoService)
}
