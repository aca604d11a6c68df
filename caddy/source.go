package pushlbcaddy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
)

func init() {
	caddy.RegisterModule(new(Upstreams))
}

// Upstreams is the dynamic upstream source "pushlb"
// (http.reverse_proxy.upstreams.pushlb): the live instances of a
// service, pushed over NATS by pushlb, with no polling and no network call
// per request.
//
// For each service it follows (the one named, or each one a placeholder
// resolves to), it keeps a snapshot of the instances, rebuilt whenever
// they change (Client.Watch): a request reads it with one atomic load.
// With the pushlb policy, a request gets the few instances pushlb's
// balancer picked for it, so its cost does not grow with the fleet; with
// Caddy's own policies it gets a copy of the list (see GetUpstreams).
type Upstreams struct {
	// Service is the service whose instances are the upstreams. It may
	// hold placeholders ("{http.request.host.labels.2}",
	// "{http.request.uri.path.0}"), resolved per request, so that one
	// site fronts many services. Required.
	Service string `json:"service,omitempty"`
	// Zone is the zone this Caddy runs in. The pushlb selection policy
	// prefers its instances as the gateway's ZonePreference filter does
	// (the other zones take over when it has no instance, or every one
	// of its instances has its breaker open). Caddy's own policies do not
	// know zones and ignore it. Default: none.
	Zone string `json:"zone,omitempty"`

	// ClientConfig is the shared client this source takes its lists
	// from: the pushlb deployment to follow and the client's settings.
	ClientConfig

	shared   *shared        // nil until provisioned
	client   *pushlb.Client // shared.client, kept after Cleanup for requests in flight
	key      string
	dynamic  bool // Service holds placeholders
	zoneCtx  context.Context
	services sync.Map // service name → *serviceList
	// pickedBy is the pushlb policy of this source's handler, once its
	// first Select saw this source's pool: GetUpstreams then hands Caddy
	// the instances that policy's balancer picks instead of the list.
	pickedBy atomic.Pointer[Selection]
	mu       sync.Mutex
	closed   bool
	logger   *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (*Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.pushlb",
		New: func() caddy.Module { return new(Upstreams) },
	}
}

// Validate reports what is wrong with the configuration without touching
// the network.
func (u *Upstreams) Validate() error {
	_, err := u.check()
	return err
}

// check validates u and prepares its registry.
func (u *Upstreams) check() (*prepared, error) {
	if strings.TrimSpace(u.Service) == "" {
		return nil, errors.New("pushlb: no service: name one (dynamic pushlb <service>), placeholders allowed")
	}
	if !strings.Contains(u.Service, "{") {
		if err := events.ValidateService(u.Service); err != nil {
			return nil, fmt.Errorf("pushlb: service %q: %w", u.Service, err)
		}
	}
	p, err := u.ClientConfig.prepare()
	if err != nil {
		return nil, fmt.Errorf("pushlb: %w", err)
	}
	return p, nil
}

// Provision takes the shared client of the registry (connecting to NATS
// and loading the registry when no loaded config has it yet) and, for a
// fixed service, starts following its list. A NATS server that cannot be
// reached within connect_timeout fails the config's load.
func (u *Upstreams) Provision(ctx caddy.Context) error {
	u.logger = ctx.Logger()
	p, err := u.check()
	if err != nil {
		return err
	}
	u.dynamic = strings.Contains(u.Service, "{")
	u.zoneCtx = context.Background()
	if u.Zone != "" {
		u.zoneCtx = balancer.WithZone(u.zoneCtx, u.Zone)
	}
	s, err := acquire(p)
	if err != nil {
		return fmt.Errorf("pushlb: registry %s: %w", p.name, err)
	}
	u.shared, u.client, u.key = s, s.client, p.key
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := register(reg, s); err != nil {
			u.logger.Warn("pushlb metrics not registered", zap.Error(err))
		}
	}
	if !u.dynamic {
		u.follow(u.Service)
	}
	u.logger.Debug("pushlb upstream source ready", zap.String("service", u.Service), zap.String("zone", u.Zone), zap.String("registry", p.name))
	return nil
}

// Cleanup stops following the services and releases this config's
// reference to the shared client; the client stays up while another
// loaded config (the one replacing this one) uses it.
func (u *Upstreams) Cleanup() error {
	u.mu.Lock()
	wasClosed := u.closed
	u.closed = true
	u.mu.Unlock()
	if wasClosed || u.shared == nil {
		return nil
	}
	u.services.Range(func(_, v any) bool {
		v.(*serviceList).stop()
		return true
	})
	return release(u.key)
}

// GetUpstreams returns the upstreams of the request's service, from the
// list as last pushed: no network call, no lock. An unknown service
// (nothing announced it) has none.
//
// Caddy writes into the upstreams it is given (their health state, on
// every request), so they cannot be shared between requests: each call
// returns upstreams of its own. Under the pushlb policy they are the few
// instances pushlb's balancer picked for this request (O(1), whatever the
// fleet's size); under another policy, which must see every instance,
// they are a copy of the list (one allocation of the list's size, as
// Caddy's own dynamic sources make).
func (u *Upstreams) GetUpstreams(r *http.Request) ([]*reverseproxy.Upstream, error) {
	name := u.Service
	if u.dynamic {
		repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		if repl == nil {
			return nil, errors.New("pushlb: no replacer in the request's context")
		}
		name = repl.ReplaceAll(u.Service, "")
	}
	l := u.list(r.Context(), name)
	if l == nil {
		return nil, nil
	}
	snap := l.snap.Load()
	if len(snap.dials) == 0 {
		return nil, nil
	}
	if sel := u.pickedBy.Load(); sel != nil && snap.hasBalancer {
		return snap.candidates(r, sel), nil
	}
	// The pushlb policy finds the snapshot here, and maps its pick onto
	// the copy by index.
	if a, ok := caddyhttp.GetVar(r.Context(), attemptVar).(*attempt); ok {
		a.finish() // Caddy retries: the previous attempt's outcome first
	}
	caddyhttp.SetVar(r.Context(), poolVar, snap)
	return snap.copyUpstreams(), nil
}

// list returns the followed list of service, following it first when it is
// a service the registry holds (the client follows it on this request,
// within ctx); nil for a name nothing announced.
func (u *Upstreams) list(ctx context.Context, service string) *serviceList {
	if v, ok := u.services.Load(service); ok {
		return v.(*serviceList)
	}
	if !u.dynamic {
		return nil
	}
	// A name from a request: follow it only once the client has a
	// balancer for it (something announced it), so that made-up names
	// cost a bounded lookup and hold nothing.
	if _, err := u.client.Follow(ctx, service); err != nil {
		return nil
	}
	return u.follow(service)
}

// follow starts following service's list, once.
func (u *Upstreams) follow(service string) *serviceList {
	u.mu.Lock()
	defer u.mu.Unlock()
	if v, ok := u.services.Load(service); ok {
		return v.(*serviceList)
	}
	l := &serviceList{stop: func() {}}
	l.snap.Store(&poolSnapshot{service: service, source: u})
	if u.closed {
		return l
	}
	l.stop = u.client.Watch(service, func(servers []*balancer.Server) {
		l.snap.Store(newPoolSnapshot(u, service, servers))
	})
	u.services.Store(service, l)
	return l
}

// serviceList is one followed service: its current snapshot, replaced
// whole on every change of its instances.
type serviceList struct {
	snap atomic.Pointer[poolSnapshot]
	stop func()
}

// poolSnapshot is the instances of one service at one moment, immutable
// once published.
type poolSnapshot struct {
	service string
	source  *Upstreams
	dials   []string       // the alive instances' addresses, in list order
	byID    map[string]int // instance ID → index in dials
	// byHint holds the addresses of the alive instances carrying each
	// metadata hint (balancer.HintKey), in list order: the pushlb
	// policy's stand-ins for a hinted request (candidates).
	byHint map[string][]string
	// balancer is the service's balancer in the shared client, which
	// the pushlb selection policy picks with; hasBalancer is false while
	// the client has none.
	balancer    pushlb.Balancer
	hasBalancer bool
}

// newPoolSnapshot builds the snapshot of servers: their alive ones, each
// dialled at its address.
func newPoolSnapshot(u *Upstreams, service string, servers []*balancer.Server) *poolSnapshot {
	s := &poolSnapshot{service: service, source: u, byID: make(map[string]int, len(servers))}
	for _, srv := range servers {
		if !srv.Alive() {
			continue
		}
		s.byID[srv.ID] = len(s.dials)
		s.dials = append(s.dials, srv.Addr())
		if h := srv.Metadata[balancer.HintKey]; h != "" {
			if s.byHint == nil {
				s.byHint = make(map[string][]string)
			}
			s.byHint[h] = append(s.byHint[h], srv.Addr())
		}
	}
	b, err := u.client.Balancer(service)
	s.balancer, s.hasBalancer = b, err == nil
	return s
}

// copyUpstreams returns one upstream per instance, in list order: two
// allocations.
func (s *poolSnapshot) copyUpstreams() []*reverseproxy.Upstream {
	block := make([]reverseproxy.Upstream, len(s.dials))
	out := make([]*reverseproxy.Upstream, len(s.dials))
	for i := range block {
		block[i].Dial = s.dials[i]
		out[i] = &block[i]
	}
	return out
}

// poolVar is the request variable through which GetUpstreams hands its
// snapshot to the pushlb selection policy.
const poolVar = "pushlb.pool"

// Interface guards
var (
	_ caddy.Provisioner           = (*Upstreams)(nil)
	_ caddy.CleanerUpper          = (*Upstreams)(nil)
	_ caddy.Validator             = (*Upstreams)(nil)
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
)
