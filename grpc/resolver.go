package pushlbgrpc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
)

// Scheme is the target scheme the resolver serves: "pushlb:///<service>".
const Scheme = "pushlb"

// ErrNoInstances is wrapped by the error a ClientConn gets while its
// service has no instance: RPCs fail with codes.Unavailable and a message
// naming the service.
var ErrNoInstances = errors.New("pushlbgrpc: no instances")

// NewBuilder returns a resolver.Builder for the "pushlb" scheme over c,
// for grpc.WithResolvers (no global registration: each ClientConn names
// its builder). c should be started; a target's list is then current from
// the first resolution on. The builder may serve any number of
// ClientConns.
func NewBuilder(c *pushlb.Client, opts ...BuilderOption) resolver.Builder {
	b := &builder{c: c, zone: c.Zone()}
	for _, o := range opts {
		o(b)
	}
	return b
}

// A BuilderOption customises NewBuilder.
type BuilderOption func(*builder)

// WithZone sets the zone the ClientConns of this builder run in, for the
// pushlb balancer's zone filters and avoidance (default: the client's
// pushlb.Config.Zone). A "zone" in the balancer's service config wins
// over it; WithCallZone forces a zone for one RPC.
func WithZone(zone string) BuilderOption { return func(b *builder) { b.zone = zone } }

type builder struct {
	c    *pushlb.Client
	zone string
}

// Scheme implements resolver.Builder.
func (b *builder) Scheme() string { return Scheme }

// Build implements resolver.Builder: target's endpoint names the service
// ("pushlb:///orders"). It follows the service through the client
// (pushlb.Client.Follow, then Watch) and hands grpc-go each new list at
// once. An invalid service name is an error.
func (b *builder) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	service := target.Endpoint()
	if err := events.ValidateService(service); err != nil {
		return nil, fmt.Errorf("pushlbgrpc: target %q: %w", target.URL.String(), err)
	}
	r := &pushlbResolver{service: service, cc: cc, attrs: attributes.New(clientZoneKey{}, b.zone)}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.watch(ctx, b.c)
	return r, nil
}

// pushlbResolver follows one service. Its calls into the ClientConn come
// from the Watch's calls, which never overlap.
type pushlbResolver struct {
	service string
	cc      resolver.ClientConn
	attrs   *attributes.Attributes // the State's: the client's zone
	cancel  context.CancelFunc     // ends watch's follow

	mu     sync.Mutex
	stop   func() // the Watch's, once it started
	closed bool
}

// watch follows the service through the client first (pushlb.Client.Follow:
// a client that follows on request loads its list, within the client's
// FollowTimeout), so that the first state grpc-go gets holds the service's
// instances; until then its RPCs wait as for any resolver that has not
// answered yet. Then it watches the list: a service the registry does not
// hold yet is watched all the same, and its instances come when announced.
func (r *pushlbResolver) watch(ctx context.Context, c *pushlb.Client) {
	c.Follow(ctx, r.service) // its error says no more than the Watch will
	if ctx.Err() != nil {
		return // closed
	}
	stop := c.Watch(r.service, r.update)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		stop()
		return
	}
	r.stop = stop
}

// update hands grpc-go the service's list. An empty list clears the
// addresses, then reports an error naming the service, so that RPCs fail
// with codes.Unavailable instead of reaching instances that left.
func (r *pushlbResolver) update(servers []*balancer.Server) {
	if len(servers) == 0 {
		r.cc.UpdateState(resolver.State{Attributes: r.attrs})
		r.cc.ReportError(fmt.Errorf("%w of %q", ErrNoInstances, r.service))
		return
	}
	st := resolver.State{
		Attributes: r.attrs,
		Endpoints:  make([]resolver.Endpoint, len(servers)),
		Addresses:  make([]resolver.Address, len(servers)),
	}
	for i, s := range servers {
		attrs := attributes.New(instanceIDKey{}, s.ID).
			WithValue(zoneKey{}, s.Zone).
			WithValue(metadataKey{}, metadataAttr(maps.Clone(s.Metadata)))
		addr := resolver.Address{Addr: s.Addr(), Attributes: attrs}
		st.Addresses[i] = addr
		st.Endpoints[i] = resolver.Endpoint{Addresses: []resolver.Address{addr}, Attributes: attrs}
	}
	// Errors ask for a re-resolution; a watch has nothing better to give
	// until the next change, which it hands over unasked.
	r.cc.UpdateState(st)
}

// ResolveNow implements resolver.Resolver. It does nothing: the list is
// pushed on every change, never polled.
func (r *pushlbResolver) ResolveNow(resolver.ResolveNowOptions) {}

// Close implements resolver.Resolver: it stops the watch.
func (r *pushlbResolver) Close() {
	r.cancel()
	r.mu.Lock()
	r.closed = true
	stop := r.stop
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
}

type (
	clientZoneKey struct{} // in resolver.State.Attributes
	instanceIDKey struct{}
	zoneKey       struct{}
	metadataKey   struct{}
)

// metadataAttr is an instance's metadata as an attribute value: a map, with
// the Equal that attributes compare values with.
type metadataAttr map[string]string

// Equal implements the comparison of attribute values.
func (m metadataAttr) Equal(o any) bool {
	om, ok := o.(metadataAttr)
	return ok && maps.Equal(m, om)
}

// InstanceID returns the pushlb instance ID of a resolved address or
// endpoint's attributes, and whether it has one.
func InstanceID(a *attributes.Attributes) (string, bool) {
	id, ok := a.Value(instanceIDKey{}).(string)
	return id, ok
}

// Zone returns the zone of a resolved address or endpoint's attributes
// ("" for the default zone).
func Zone(a *attributes.Attributes) string {
	z, _ := a.Value(zoneKey{}).(string)
	return z
}

// Metadata returns the registry metadata of a resolved address or
// endpoint's attributes; do not modify it.
func Metadata(a *attributes.Attributes) map[string]string {
	m, _ := a.Value(metadataKey{}).(metadataAttr)
	return m
}

var (
	_ resolver.Builder  = (*builder)(nil)
	_ resolver.Resolver = (*pushlbResolver)(nil)
)
