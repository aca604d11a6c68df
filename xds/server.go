package pushlbxds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
)

// Server is an xDS control plane (ADS, state of the world and delta) that
// serves the services of a pushlb.Client (on demand over one that follows
// on request: ondemand.go): for each, a Listener, a
// RouteConfiguration, a Cluster and a ClusterLoadAssignment, all named
// after the service. Build it with NewServer, run it with Serve, stop it
// with Stop. See the package documentation for the resources and the
// threading rules.
type Server struct {
	c     *pushlb.Client
	o     options
	cache *zonedCache
	xds   xdsserver.Server
	gs    *grpc.Server

	ctx    context.Context // ends the xDS streams at Stop
	cancel context.CancelFunc

	lifeMu  sync.Mutex // guards started and stopped
	started bool
	stopped bool
	stop    chan struct{} // closed by Stop: ends the feed
	ready   chan struct{} // closed by the feed once the first resources are installed
	wg      sync.WaitGroup

	// What the watches hand the feed. Each service's watch has a
	// generation: a list from a watch the feed has replaced is dropped.
	mu           sync.Mutex
	gens         map[string]uint64
	pendingLists map[string][]endpoint
	pendingNames []string
	namesPending bool
	demandMoved  bool          // the names the streams subscribe to changed (on demand)
	wake         chan struct{} // capacity 1: the feed has work

	// The feed goroutine's own.
	names   []string          // the client's services, as WatchServices last said
	watches map[string]func() // service -> stop of its Watch
	fresh   map[string]bool   // services whose Listener, RouteConfiguration and Cluster are not installed yet
	gen     uint64

	services    atomic.Int64
	listUpdates atomic.Uint64
	streams     atomic.Int64
	responses   atomic.Uint64
	nacks       atomic.Uint64
	dropped     atomic.Uint64
	badWeights  atomic.Uint64
	invalid     atomic.Uint64

	// On demand (ondemand.go): nil unless the client follows on request.
	demand                                 *demand
	follows, followsFailed, followsRefused atomic.Uint64
}

// Stats are a Server's counters.
type Stats struct {
	// Services is the number of services served.
	Services int
	// ListUpdates counts the lists installed: each one a new version of
	// the service's ClusterLoadAssignment for every client zone.
	ListUpdates uint64
	// ClientZones is the number of client zones served with their zone
	// first (see WithMaxClientZones).
	ClientZones int
	// Streams is the number of open xDS streams.
	Streams int64
	// Responses counts the responses sent on the streams (state of the
	// world and delta): each carries a resource type's new version, or
	// the resources a client asked for.
	Responses uint64
	// NACKs counts the responses clients rejected (each is logged with the
	// client's error).
	NACKs uint64
	// DroppedInstances counts the instances left out of a
	// ClusterLoadAssignment (logged): an address another instance of the
	// service has, no host or port.
	DroppedInstances uint64
	// BadWeights counts the instances whose weight metadata was ignored
	// (logged): not a whole number from 1 to MaxWeight.
	BadWeights uint64
	// InvalidResources counts the resources not installed because they
	// failed validation (logged); the previous version stays.
	InvalidResources uint64
	// Follows counts the services followed because a stream subscribed to
	// them (a client on demand: pushlb.FollowRequested); FollowsFailed the
	// names that could not be (none registered, a timeout: logged at
	// debug); FollowsRefused the names put off because 64 follows were
	// under way.
	Follows, FollowsFailed, FollowsRefused uint64
}

// NewServer builds a server over c with opts. It starts nothing: no
// watch, no goroutine, no listener. c should be started by the time Serve
// is called, so that the first resources hold the registry's instances.
// Errors wrap ErrInvalidOption.
func NewServer(c *pushlb.Client, opts ...Option) (*Server, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil *pushlb.Client", ErrInvalidOption)
	}
	o := defaultOptions()
	var errs []error
	for i, opt := range opts {
		if opt == nil {
			errs = append(errs, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i))
			continue
		}
		if err := opt(&o); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.regionPriority == nil {
		_, o.regionPriority = c.Region()
	}
	s := &Server{
		c: c, o: o,
		stop:         make(chan struct{}),
		ready:        make(chan struct{}),
		gens:         map[string]uint64{},
		pendingLists: map[string][]endpoint{},
		wake:         make(chan struct{}, 1),
		watches:      map[string]func(){},
		fresh:        map[string]bool{},
	}
	if c.FollowMode() == pushlb.FollowRequested {
		s.demand = newDemand()
	}
	// A version prefix of its own per server, so that a client that
	// reconnects to a restarted server gets every resource again.
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	s.cache = newZonedCache(prefix, o.maxZones, s.buildLoadAssignment, s.newZone)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.xds = xdsserver.NewServer(s.ctx, s.cache, s.callbacks())
	s.gs = grpc.NewServer(o.grpcOpts...)
	discoverypb.RegisterAggregatedDiscoveryServiceServer(s.gs, s.xds)
	return s, nil
}

// Serve starts following the client's services (on the first call) and,
// once the resources of every service the client has are installed (so
// that no client is told a service does not exist while the server
// starts), serves ADS on ln until Stop; it then returns nil. It returns
// ErrStopped when Stop was called before, and the gRPC server's error when
// ln fails. It may be called on several listeners, from any goroutine.
func (s *Server) Serve(ln net.Listener) error {
	s.lifeMu.Lock()
	if s.stopped {
		s.lifeMu.Unlock()
		return ErrStopped
	}
	if !s.started {
		s.started = true
		s.wg.Go(s.feed)
		if s.demand != nil {
			s.wg.Go(s.retry)
		}
	}
	s.lifeMu.Unlock()
	select {
	case <-s.ready:
	case <-s.stop:
		return ErrStopped
	}
	if err := s.gs.Serve(ln); err != nil {
		if errors.Is(err, grpc.ErrServerStopped) {
			return ErrStopped
		}
		return fmt.Errorf("pushlbxds: serve on %s: %w", ln.Addr(), err)
	}
	return nil
}

// Stop stops following the client, ends every xDS stream, closes the
// listeners and waits until the server's goroutines have ended. Clients
// keep the resources they have (grpc-go and Envoy do) and reconnect. Stop
// may be called from any goroutine, more than once.
func (s *Server) Stop() {
	s.lifeMu.Lock()
	if s.stopped {
		s.lifeMu.Unlock()
		return
	}
	s.stopped = true
	close(s.stop)
	s.lifeMu.Unlock()
	s.cancel()
	s.gs.Stop()
	s.wg.Wait()
}

// Stats returns the server's counters. It may be called at any time.
func (s *Server) Stats() Stats {
	return Stats{
		Services:         int(s.services.Load()),
		ListUpdates:      s.listUpdates.Load(),
		ClientZones:      s.cache.zones(),
		Streams:          s.streams.Load(),
		Responses:        s.responses.Load(),
		NACKs:            s.nacks.Load(),
		DroppedInstances: s.dropped.Load(),
		BadWeights:       s.badWeights.Load(),
		InvalidResources: s.invalid.Load(),
		Follows:          s.follows.Load(),
		FollowsFailed:    s.followsFailed.Load(),
		FollowsRefused:   s.followsRefused.Load(),
	}
}

// signal tells the feed it has work, without blocking.
func (s *Server) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// namesChanged is the WatchServices function: it hands the names over.
func (s *Server) namesChanged(names []string) {
	s.mu.Lock()
	s.pendingNames, s.namesPending = names, true
	s.mu.Unlock()
	s.signal()
}

// listChanged returns the Watch function of one generation of a service's
// watch: it converts the list and hands it over.
func (s *Server) listChanged(service string, gen uint64) func([]*balancer.Server) {
	return func(servers []*balancer.Server) {
		eps := endpoints(servers)
		s.mu.Lock()
		if s.gens[service] != gen {
			s.mu.Unlock()
			return
		}
		s.pendingLists[service] = eps
		s.mu.Unlock()
		s.signal()
	}
}

// feed is the goroutine that turns the client's names and lists into
// resources, one change at a time. The watches only hand their data over
// (so the push path never waits for xDS), and the feed takes what is
// pending at once: a burst of changes becomes the latest list.
func (s *Server) feed() {
	stopNames := s.c.WatchServices(s.namesChanged)
	defer func() {
		stopNames()
		for _, stop := range s.watches {
			stop()
		}
	}()
	// The first names came at once, and with them each service's first
	// list (Watch calls its function before it returns).
	for s.apply() {
	}
	close(s.ready)
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		}
		for s.apply() {
		}
	}
}

// apply installs what is pending and reports whether there was anything.
func (s *Server) apply() bool {
	s.mu.Lock()
	names, namesPending, demandMoved := s.pendingNames, s.namesPending, s.demandMoved
	s.pendingNames, s.namesPending, s.demandMoved = nil, false, false
	var lists map[string][]endpoint
	if len(s.pendingLists) > 0 {
		lists, s.pendingLists = s.pendingLists, map[string][]endpoint{}
	}
	s.mu.Unlock()
	if !namesPending && !demandMoved && len(lists) == 0 {
		return false
	}
	if namesPending {
		s.names = names
	}
	if namesPending || demandMoved {
		s.follow(s.served(s.names))
	}
	for service, eps := range lists {
		if _, ok := s.watches[service]; ok {
			s.install(service, eps)
		}
	}
	return true
}

// follow watches the services that are new in names and removes the
// resources of those gone. A new service's first list arrives at once
// (Watch calls its function before it returns), pending for the next
// apply.
func (s *Server) follow(names []string) {
	current := make(map[string]bool, len(names))
	for _, name := range names {
		current[name] = true
		if _, ok := s.watches[name]; ok {
			continue
		}
		s.gen++
		s.mu.Lock()
		s.gens[name] = s.gen
		s.mu.Unlock()
		s.fresh[name] = true
		s.watches[name] = s.c.Watch(name, s.listChanged(name, s.gen))
		s.services.Add(1)
	}
	for name, stop := range s.watches {
		if current[name] {
			continue
		}
		stop()
		delete(s.watches, name)
		s.mu.Lock()
		delete(s.gens, name)
		delete(s.pendingLists, name)
		s.mu.Unlock()
		if !s.fresh[name] {
			s.cache.setService(name, nil, nil, nil)
		}
		delete(s.fresh, name)
		s.cache.removeList(name)
		s.services.Add(-1)
		s.o.log.Info().Str("service", name).Msg("xds: service removed")
	}
}

// install makes a list the service's ClusterLoadAssignments, then, for a
// new service, adds its Listener, RouteConfiguration and Cluster.
func (s *Server) install(service string, eps []endpoint) {
	for _, e := range eps {
		if e.badValue != "" {
			s.badWeights.Add(1)
			s.o.log.Warn().Str("service", service).Str("instance", e.id).Str(WeightKey, e.badValue).
				Msgf("xds: weight ignored: want a whole number from 1 to %d", MaxWeight)
		}
	}
	if s.cache.setList(service, eps) {
		s.listUpdates.Add(1)
	}
	if !s.fresh[service] {
		return
	}
	l, err := listenerFor(service)
	if err == nil {
		var r, c types.Resource
		if r, err = routeFor(service); err == nil {
			if c, err = clusterFor(service, s.o.http2); err == nil {
				s.cache.setService(service, l, r, c)
				delete(s.fresh, service)
				s.o.log.Info().Str("service", service).Msg("xds: service added")
				return
			}
		}
	}
	s.invalid.Add(1)
	s.o.log.Error().Err(err).Str("service", service).Msg("xds: service not served: its resources are invalid")
}

// buildLoadAssignment is the cache's builder of ClusterLoadAssignments:
// nil when the resource is invalid (logged and counted). The instances
// left out are logged and counted once per list, with the resource of
// clients without a zone (which every list builds).
func (s *Server) buildLoadAssignment(service string, eps []endpoint, loc clientLocality) types.Resource {
	cla, drops, err := loadAssignmentFor(service, eps, loc, s.o.regionPriority)
	if loc == (clientLocality{}) {
		for _, d := range drops {
			s.dropped.Add(1)
			s.o.log.Warn().Str("service", service).Str("instance", d.id).Str("reason", d.reason).
				Msg("xds: instance left out of the service's endpoints")
		}
	}
	if err != nil {
		s.invalid.Add(1)
		s.o.log.Error().Err(err).Str("service", service).Stringer("client_locality", loc).
			Msg("xds: endpoints not updated: the new resource is invalid")
		return nil
	}
	return cla
}

// newZone logs a client locality the first time it is seen.
func (s *Server) newZone(loc clientLocality, admitted bool) {
	if admitted {
		s.o.log.Info().Stringer("client_locality", loc).Msg("xds: serving clients of a new locality, their zone and region first")
		return
	}
	s.o.log.Warn().Stringer("client_locality", loc).Int("max", s.o.maxZones).
		Msg("xds: too many client localities: this one is served as a client without a zone or region")
}

// callbacks counts the streams and the responses, and logs and counts the
// NACKs.
func (s *Server) callbacks() xdsserver.Callbacks {
	open := func(context.Context, int64, string) error { s.streams.Add(1); return nil }
	closed := func(id int64, _ *corepb.Node) {
		s.streams.Add(-1)
		if s.demand != nil {
			s.demand.closed(id)
			s.demandChanged()
		}
	}
	nack := func(node *corepb.Node, typeURL string, names []string, detail string) {
		s.nacks.Add(1)
		s.o.log.Warn().Str("node", node.GetId()).Str("type", typeURL).Strs("resources", names).Str("error", detail).
			Msg("xds: a client rejected a response")
	}
	return xdsserver.CallbackFuncs{
		StreamOpenFunc:        open,
		StreamClosedFunc:      closed,
		DeltaStreamOpenFunc:   open,
		DeltaStreamClosedFunc: closed,
		StreamRequestFunc: func(id int64, req *discoverypb.DiscoveryRequest) error {
			if d := req.GetErrorDetail(); d != nil {
				nack(req.GetNode(), req.GetTypeUrl(), req.GetResourceNames(), d.GetMessage())
			}
			if s.demand != nil {
				s.demand.set(id, req.GetTypeUrl(), req.GetResourceNames())
				s.demandChanged()
				s.want(req.GetResourceNames())
			}
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, req *discoverypb.DeltaDiscoveryRequest) error {
			if d := req.GetErrorDetail(); d != nil {
				nack(req.GetNode(), req.GetTypeUrl(), req.GetResourceNamesSubscribe(), d.GetMessage())
			}
			if s.demand != nil {
				s.demand.change(id, req.GetTypeUrl(), req.GetResourceNamesSubscribe(), req.GetResourceNamesUnsubscribe())
				s.demandChanged()
				s.want(req.GetResourceNamesSubscribe())
			}
			return nil
		},
		StreamResponseFunc: func(context.Context, int64, *discoverypb.DiscoveryRequest, *discoverypb.DiscoveryResponse) {
			s.responses.Add(1)
		},
		StreamDeltaResponseFunc: func(int64, *discoverypb.DeltaDiscoveryRequest, *discoverypb.DeltaDiscoveryResponse) {
			s.responses.Add(1)
		},
	}
}
