package pushlbgrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/base"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	lb "github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/balancer/lbconfig"
)

// Name is the balancer's name in a service config:
// {"loadBalancingConfig":[{"pushlb":{...}}]}.
const Name = "pushlb"

var logger = grpclog.Component("pushlb")

// RegisterBalancer registers the pushlb balancer with grpc-go under Name,
// so that service configs can name it. Call it once, at start-up (from
// an init function or main), as grpc-go's balancer.Register asks: it is not
// safe to call concurrently with the creation of ClientConns.
func RegisterBalancer() { balancer.Register(balancerBuilder{}) }

// Config is the pushlb balancer's configuration: the JSON object under
// "pushlb" in a service config's loadBalancingConfig. Its keys are the
// balancer keys of the gateway's YAML (docs/config.md, "balancer"), in
// JSON, plus hashKey and hintKey:
//
//	{"loadBalancingConfig": [{"pushlb": {
//	    "rule": "ZoneAvoidance",
//	    "filter": "ZonePreference",
//	    "zone": "us-east-1a",
//	    "breaker": {"threshold": 3, "factor": "10s", "max": "30s"},
//	    "hashKey": "x-user-id",
//	    "hintKey": "x-pushlb-hint"
//	}}]}
//
// Keys that concern HTTP only (timeouts, retries, pings, static lists)
// are refused: gRPC has its own (the service config's timeout and
// retryPolicy). An empty object takes the defaults: ZoneAvoidance,
// ZonePreference, the breaker of 3 connect failures.
type Config struct {
	serviceconfig.LoadBalancingConfig `json:"-"`

	// Balancer is the balancer core's configuration.
	Balancer lb.Config
	// HashKey names the outgoing metadata key whose value keys the
	// keyed rules (Maglev, Rendezvous): RPCs with equal values go to the
	// same server. Empty: keyed rules get no key and spread RPCs.
	HashKey string
	// HintKey names the outgoing metadata key whose value is the RPC's
	// hint (lb.WithHint): the servers announced with metadata hint=<value>
	// take the RPC, and when none is alive it goes where it would have
	// gone without the hint, as the gateway's X-Pushlb-Hint header.
	// Empty: DefaultHintKey; "-": no hint key (a hint set on the RPC's
	// context with lb.WithHint still applies).
	HintKey string
}

// DefaultHintKey is the outgoing metadata key an RPC's hint is read from
// unless Config.HintKey names another: the gateway's hint header
// (X-Pushlb-Hint), as gRPC metadata keys are lower-case.
const DefaultHintKey = "x-pushlb-hint"

// noHintKey is the HintKey value that turns the hint key off.
const noHintKey = "-"

// hintKey returns the metadata key to read the hint from, or "" for none.
func (c *Config) hintKey() string {
	switch c.HintKey {
	case "":
		return DefaultHintKey
	case noHintKey:
		return ""
	}
	return c.HintKey
}

// allowedKeys are the balancer keys that mean something for gRPC.
var allowedKeys = []string{
	"rule", "filter", "zone", "zoneAware", "zoneAffinity", "zoneAvoidance",
	"zoneStatsInterval", "breaker", "activeRequestsTimeout",
	"activeConnectionsLimit", "weightsInterval", "retryTimeout",
	"retrySubRule", "outlierDetection", "panicThreshold", "slowStart", "hashKey", "hintKey",
}

// ParseConfig parses the JSON of the balancer's configuration; errors name
// the key.
func ParseConfig(js json.RawMessage) (*Config, error) {
	var fields map[string]json.RawMessage
	if len(bytes.TrimSpace(js)) == 0 {
		js = []byte("{}")
	}
	if err := json.Unmarshal(js, &fields); err != nil {
		return nil, fmt.Errorf("pushlb: service config: %w", err)
	}
	cfg := &Config{}
	for k, v := range fields {
		if !slices.Contains(allowedKeys, k) {
			return nil, fmt.Errorf("pushlb: service config: unknown or HTTP-only key %q (gRPC keys: %s)", k, strings.Join(allowedKeys, ", "))
		}
		if target := map[string]*string{"hashKey": &cfg.HashKey, "hintKey": &cfg.HintKey}[k]; target != nil {
			if err := json.Unmarshal(v, target); err != nil {
				return nil, fmt.Errorf("pushlb: service config: %s: %w", k, err)
			}
			*target = strings.ToLower(*target) // metadata keys are lower-case
			delete(fields, k)
		}
	}
	if k := cfg.HintKey; k != "" && k != noHintKey && !validMetadataKey(k) {
		return nil, fmt.Errorf("pushlb: service config: hintKey %q: not a metadata key (letters, digits, '-', '_', '.'; not -bin; %q: none)", k, noHintKey)
	}
	// JSON is YAML: the core's loader reads it with the gateway's rules
	// (defaults merged key by key, durations as "10s", every value checked).
	rest, err := json.Marshal(map[string]any{"defaults": fields})
	if err != nil {
		return nil, fmt.Errorf("pushlb: service config: %w", err)
	}
	cc, err := lbconfig.LoadYAML(bytes.NewReader(rest))
	if err != nil {
		return nil, fmt.Errorf("pushlb: service config: %s", strings.ReplaceAll(err.Error(), "defaults.", ""))
	}
	cfg.Balancer = cc.Defaults
	return cfg, nil
}

// validMetadataKey reports whether k, lower-case, is a text metadata key
// as grpc-go sends it: letters, digits, '-', '_' and '.', not a binary
// ("-bin") one.
func validMetadataKey(k string) bool {
	if strings.HasSuffix(k, "-bin") {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

type balancerBuilder struct{}

func (balancerBuilder) Name() string { return Name }

func (balancerBuilder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	return ParseConfig(js)
}

// Build implements balancer.Builder: an endpointsharding balancer with a
// pickfirst child per endpoint, as grpc-go's own round_robin, whose
// aggregated state this balancer intercepts to pick with pushlb's core.
func (balancerBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &pushlbBalancer{ClientConn: cc, target: opts.Target.Endpoint()}
	b.child = endpointsharding.NewBalancer(b, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	return b
}

// pushlbBalancer is one ClientConn's balancer. It embeds the ClientConn to
// intercept UpdateState from its endpointsharding child.
//
// Threading: grpc-go serialises the calls into a balancer (Update*,
// ResolverError, ExitIdle, Close); the child calls UpdateState from within
// those calls or from its own serialised callbacks. mu guards the fields
// below it against the two.
type pushlbBalancer struct {
	balancer.ClientConn
	child  balancer.Balancer
	target string

	mu       sync.Mutex
	cfg      *Config
	zone     string               // the resolver's zone (State.Attributes), used when cfg has none
	core     *lb.Balancer         // nil until the first configuration
	lastDown []string             // endpoints left out of the last list, for the log
	entries  map[string]*endpoint // by first address: the last list's endpoints
	hinted   bool                 // some endpoint of entries carries metadata lb.HintKey
	noList   error                // the resolver's error while it gives no endpoint
}

func (b *pushlbBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	cfg, ok := s.BalancerConfig.(*Config)
	if !ok || cfg == nil {
		cfg = &Config{Balancer: lb.DefaultConfig()}
	}
	zone := ""
	if s.ResolverState.Attributes != nil {
		zone, _ = s.ResolverState.Attributes.Value(clientZoneKey{}).(string)
	}
	b.mu.Lock()
	if len(s.ResolverState.Endpoints) > 0 {
		b.noList = nil
	} else if b.noList == nil {
		// The resolver's error, if it sends one, comes after the list.
		b.noList = fmt.Errorf("%w of %q", ErrNoInstances, b.target)
	}
	if b.core == nil || !configEqual(b.cfg, cfg) || b.zone != zone {
		if err := b.newCoreLocked(cfg, zone); err != nil {
			b.mu.Unlock()
			return fmt.Errorf("%w: %w", balancer.ErrBadResolverState, err)
		}
	}
	b.mu.Unlock()
	// The children get no balancer config: it is ours, not pickfirst's.
	return b.child.UpdateClientConnState(balancer.ClientConnState{
		ResolverState: pickfirst.EnableHealthListener(s.ResolverState),
	})
}

// newCoreLocked replaces the core balancer for a new configuration; the
// next UpdateState fills it. Stats start over: a new rule or breaker is a
// new balancer.
func (b *pushlbBalancer) newCoreLocked(cfg *Config, zone string) error {
	c := cfg.Balancer
	if c.Zone == "" {
		c.Zone = zone
	}
	name := b.target
	if name == "" {
		name = "grpc"
	}
	var opts []lb.Option
	if rule, _ := lb.CanonicalRule(c.Rule); rule != lb.RuleWeightedResponseTime {
		// Only that rule reads response times: the others' picks read
		// no system clock, which would cost more than the pick.
		opts = append(opts, lb.WithoutPickTiming())
	}
	core, err := lb.New(name, c, opts...)
	if err != nil {
		return err
	}
	if err := core.Start(context.Background()); err != nil { // the coarse clock; no ping, no polling
		core.Close()
		return err
	}
	if b.core != nil {
		core.SetServers(serversOf(b.core.AllServers()))
		b.core.Close()
	}
	b.core, b.cfg, b.zone = core, cfg, zone
	b.entries = nil // the next UpdateState lists every endpoint in the new core
	return nil
}

func configEqual(a, b *Config) bool {
	if a == nil || b == nil {
		return a == b
	}
	aj, _ := json.Marshal(a.Balancer)
	bj, _ := json.Marshal(b.Balancer)
	return a.HashKey == b.HashKey && a.HintKey == b.HintKey && bytes.Equal(aj, bj)
}

func serversOf(list []*lb.Server) []lb.Server {
	out := make([]lb.Server, len(list))
	for i, s := range list {
		out[i] = *s
	}
	return out
}

// ResolverError passes the resolver's error on. While there is no
// endpoint at all (the pushlb resolver's "no instances of" a service),
// RPCs fail at once with it, as pick_first does, rather than with the
// child's "no children to pick from".
func (b *pushlbBalancer) ResolverError(err error) {
	b.mu.Lock()
	b.noList = err
	b.mu.Unlock()
	b.child.ResolverError(err)
}

func (b *pushlbBalancer) UpdateSubConnState(sc balancer.SubConn, _ balancer.SubConnState) {
	logger.Errorf("pushlb: UpdateSubConnState(%v) called unexpectedly", sc)
}

func (b *pushlbBalancer) ExitIdle() { b.child.ExitIdle() }

func (b *pushlbBalancer) Close() {
	b.child.Close()
	b.mu.Lock()
	if b.core != nil {
		b.core.Close()
	}
	b.mu.Unlock()
}

// UpdateState intercepts the child's aggregated state. Every endpoint is a
// server of the core balancer, alive while its connection is READY, so
// that its statistics and breaker outlive a reconnection. While some are
// READY, the picker is pushlb's; otherwise the child's state and picker
// (connecting, or failing with its error) pass through.
//
// It runs on every connectivity change of every endpoint, with the whole
// list: a change that leaves the list as it is (the common case, one
// endpoint connecting) updates that endpoint's entry in place, with no
// allocation proportional to the list; only a list change rebuilds the
// entries and the core's list.
func (b *pushlbBalancer) UpdateState(s balancer.State) {
	children := endpointsharding.ChildStatesFromPicker(s.Picker)
	b.mu.Lock()
	if b.core == nil {
		b.mu.Unlock()
		b.ClientConn.UpdateState(s)
		return
	}
	if !b.sameEndpoints(children) {
		b.rebuildLocked(children)
	}
	var marks map[string]bool
	ready := 0
	for _, c := range children {
		e := b.entries[firstAddr(c.Endpoint)]
		if e == nil {
			continue // left out: not host:port
		}
		st := c.State.ConnectivityState
		if st == connectivity.Ready {
			ready++
			if cp := e.child.Load(); cp == nil || cp.Picker != c.State.Picker {
				e.child.Store(&childPicker{c.State.Picker})
			}
		} else if e.child.Load() != nil {
			e.child.Store(nil)
		}
		if st == connectivity.Ready || st == connectivity.TransientFailure {
			e.tried = true
		}
		if up := e.usable(st); up != e.alive {
			e.alive = up
			if marks == nil {
				marks = make(map[string]bool)
			}
			marks[e.srv.ID] = up
		}
	}
	if marks != nil {
		b.core.MarkServers(marks)
	}
	if ready == 0 {
		if b.noList != nil && len(children) == 0 {
			s = balancer.State{
				ConnectivityState: connectivity.TransientFailure,
				Picker:            base.NewErrPicker(status.Error(codes.Unavailable, b.noList.Error())),
			}
		}
		b.mu.Unlock()
		b.ClientConn.UpdateState(s)
		return
	}
	p := &picker{core: b.core, hashKey: b.cfg.HashKey, untimed: !b.core.TimesPicks()}
	if b.hinted {
		// Without a hinted endpoint a hint changes no pick: the picker
		// skips looking for one in the RPC's metadata, a walk of its
		// context's chain.
		p.hintKey = b.cfg.hintKey()
	}
	b.mu.Unlock()
	b.ClientConn.UpdateState(balancer.State{ConnectivityState: connectivity.Ready, Picker: p})
}

// sameEndpoints reports whether children are the endpoints of the entries
// (plus those left out), with the same attributes, compared by identity:
// the resolver makes new ones for a new list. Called with b.mu held.
func (b *pushlbBalancer) sameEndpoints(children []endpointsharding.ChildState) bool {
	if b.entries == nil || len(children) != len(b.entries)+len(b.lastDown) {
		return false
	}
	listed := 0
	for _, c := range children {
		if e := b.entries[firstAddr(c.Endpoint)]; e != nil {
			if e.attrs != c.Endpoint.Attributes {
				return false
			}
			listed++
		}
	}
	return listed == len(b.entries)
}

// rebuildLocked makes the entries of a new list and sets the core's list.
// An endpoint that stays keeps its entry (its picker and readiness).
// Called with b.mu held.
func (b *pushlbBalancer) rebuildLocked(children []endpointsharding.ChildState) {
	entries := make(map[string]*endpoint, len(children))
	servers := make([]lb.Server, 0, len(children))
	var skipped []string
	for _, c := range children {
		addr := firstAddr(c.Endpoint)
		e := b.entries[addr]
		if e == nil || e.attrs != c.Endpoint.Attributes {
			srv, err := serverOf(c.Endpoint)
			if err != nil {
				skipped = append(skipped, err.Error())
				continue
			}
			ne := newEndpoint(c.Endpoint.Attributes, srv)
			if e != nil && e.srv.ID == srv.ID {
				ne.alive, ne.tried = e.alive, e.tried
				ne.child.Store(e.child.Load())
			}
			e = ne
		}
		entries[addr] = e
		servers = append(servers, e.srv)
	}
	if !slices.Equal(skipped, b.lastDown) && len(skipped) > 0 {
		logger.Errorf("pushlb: %s: endpoints left out: %s", b.target, strings.Join(skipped, "; "))
	}
	b.lastDown, b.entries, b.hinted = skipped, entries, false
	for _, srv := range servers {
		if srv.Metadata[lb.HintKey] != "" {
			b.hinted = true
			break
		}
	}
	if len(servers) > 0 {
		if err := b.core.SetServers(servers); err != nil {
			logger.Warningf("pushlb: %s: %v", b.target, err)
		}
	}
	// A server new to the core starts alive, as a new endpoint does (see
	// endpoint.usable); one that stays keeps its liveness.
	marks := map[string]bool{}
	for _, srv := range b.core.AllServers() {
		if e, _ := srv.Value.(*endpoint); e != nil && srv.Alive() != e.alive {
			marks[srv.ID] = e.alive
		}
	}
	if len(marks) > 0 {
		b.core.MarkServers(marks)
	}
}

func firstAddr(ep resolver.Endpoint) string {
	if len(ep.Addresses) == 0 {
		return ""
	}
	return ep.Addresses[0].Addr
}

// endpoint is the balancer's entry for one endpoint of the list. The
// pickers share it: child is written by UpdateState and read by picks.
type endpoint struct {
	attrs *attributes.Attributes      // the endpoint's, compared by identity
	srv   lb.Server                   // as given to the core
	alive bool                        // as the core has it; under pushlbBalancer.mu
	tried bool                        // was READY or failed once; under pushlbBalancer.mu
	child atomic.Pointer[childPicker] // its picker while READY, else nil
	// core is the core's copy of srv that the last pick returned: any
	// copy reports into the instance's statistics, which the entry's
	// whole life shares (a server that leaves the list leaves with its
	// endpoint). report, bound once, is the Done of an untimed pick.
	core   atomic.Pointer[lb.Server]
	report func(balancer.DoneInfo)
}

func newEndpoint(attrs *attributes.Attributes, srv lb.Server) *endpoint {
	e := &endpoint{attrs: attrs, srv: srv, alive: true}
	e.srv.Value = e // a pick finds its endpoint on the core's server
	e.report = e.done
	return e
}

// done reports an untimed pick's outcome (see picker.Pick).
func (e *endpoint) done(info balancer.DoneInfo) {
	lb.Pick{Server: e.core.Load()}.Done(outcome(info))
}

// usable reports whether the core may pick the endpoint in state st: when
// READY, and while its first connection is under way (IDLE or
// CONNECTING, never READY nor failed), so that a new client's zone
// preference waits the few milliseconds its zone takes to connect rather
// than sending the first RPCs to another zone: a pick that lands on it
// waits for the next picker (ErrNoSubConnAvailable). A failed first
// connection, or a connection lost after READY, makes it unusable until
// it is READY again.
func (e *endpoint) usable(st connectivity.State) bool {
	return st == connectivity.Ready || (!e.tried && (st == connectivity.Idle || st == connectivity.Connecting))
}

// childPicker holds the picker of an endpoint's pickfirst child.
type childPicker struct{ balancer.Picker }

// serverOf turns an endpoint into the core's server: its pushlb instance
// ID, zone and metadata when the pushlb resolver made it, else its first
// address as the ID and no zone.
func serverOf(ep resolver.Endpoint) (lb.Server, error) {
	if len(ep.Addresses) == 0 {
		return lb.Server{}, errors.New("endpoint without address")
	}
	addr := ep.Addresses[0].Addr
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return lb.Server{}, fmt.Errorf("%s: not host:port", addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return lb.Server{}, fmt.Errorf("%s: port %q", addr, portStr)
	}
	s := lb.Server{ID: addr, Host: host, Port: port}
	if id, ok := InstanceID(ep.Attributes); ok && id != "" {
		s.ID = id
		s.Zone = Zone(ep.Attributes)
		s.Metadata = Metadata(ep.Attributes)
	}
	return s, nil
}

var (
	_ balancer.Builder      = balancerBuilder{}
	_ balancer.ConfigParser = balancerBuilder{}
	_ balancer.Balancer     = (*pushlbBalancer)(nil)
)
