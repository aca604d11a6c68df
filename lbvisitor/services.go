package lbvisitor

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// ErrUnknownService is returned by the Get of Services.Balancers for a
// service the table does not follow, or follows without a list yet.
var ErrUnknownService = errors.New("lbvisitor: unknown service")

// Balancers builds and releases the balancers of services; a
// *balancer.Factory is one.
type Balancers interface {
	// Get returns the balancer of name, building it on first use.
	Get(name string) (*balancer.Balancer, error)
	// Remove closes and forgets the balancer of name; it reports whether
	// there was one.
	Remove(name string) bool
}

// ServicesConfig is what Services is built with; the zero value is a table
// without guard, observer or logs.
type ServicesConfig struct {
	// Guard, when set, is every Visitor's (see Guard).
	Guard Guard
	// Observer, when set, is told of every change of every followed
	// service's list (see ListObserver).
	Observer ListObserver
	// Logger receives a line per list change and per removed service.
	Logger zerolog.Logger

	// Follower, when set, makes the table follow services on demand
	// (follow.go): Want follows a service requests ask for, and the
	// Janitor unfollows it once idle. A pushed list then builds a service
	// only while a Want follows it (the Follower delivers no other).
	Follower Follower
	// FollowTimeout bounds one on-demand follow; zero means
	// DefaultFollowTimeout (5 s).
	FollowTimeout time.Duration
	// NegativeTTL is how long a service found absent from the registry is
	// answered unknown without asking again; zero means DefaultNegativeTTL
	// (2 s).
	NegativeTTL time.Duration
	// MaxFollowing bounds the on-demand follows under way at once; zero
	// means DefaultMaxFollowing (64).
	MaxFollowing int
}

// Services is the table of the services a client follows: per service a
// balancer, built by a Balancers, and once a pushed list arrives the
// Visitor that owns its list from then on. It is where a service is
// followed (Follow: a configured service; Handle: the first pushed list
// that names a registered instance) and unfollowed (Unfollow: the
// Janitor), where requests find the balancers (Balancers), and where list
// changes are counted, logged and told to the observer and the watchers
// (Watch, WatchNames).
//
// A service built by a pushed list is published (seen by Lookup, All,
// Names, requests and watchers) once its first list is installed, so that
// no request finds it without servers while its first list is being
// resolved.
//
// Threading: every method is safe for concurrent use. Lookup and the
// requests' Get take no lock (a sync.Map's load). Handle must not run
// concurrently for one service (the subscriber never does): the lists of a
// service are applied one at a time, in order.
type Services struct {
	bals     Balancers
	guard    Guard
	observer ListObserver
	log      zerolog.Logger

	mu sync.Mutex // serialises follow and unfollow
	m  sync.Map   // service name -> *Service, published or not

	res      atomic.Pointer[Resolver] // set by Resolve
	watchers watchers
	first    atomic.Pointer[firstLists] // set while a start waits (TrackFirstLists)

	following following // on-demand follows (follow.go)

	unregistered, removed atomic.Uint64
}

// Service is one followed service.
type Service struct {
	name      string
	b         *balancer.Balancer
	published atomic.Bool
	visitor   atomic.Pointer[Visitor] // set, under Services.mu, by the first pushed list

	updates    atomic.Uint64
	lastChange atomic.Int64 // unix nanos; 0 before the first change
	requested  atomic.Bool  // set by requests, cleared by each janitor sweep
}

// Name returns the service's name.
func (sv *Service) Name() string { return sv.name }

// Balancer returns the service's balancer.
func (sv *Service) Balancer() *balancer.Balancer { return sv.b }

// Visitor returns the Visitor that owns the service's list, nil before
// its first pushed list.
func (sv *Service) Visitor() *Visitor { return sv.visitor.Load() }

// Updates counts the changes of the service's list.
func (sv *Service) Updates() uint64 { return sv.updates.Load() }

// LastChange is the time of the last change of the list; zero before the
// first.
func (sv *Service) LastChange() time.Time {
	if ns := sv.lastChange.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// NewServices builds an empty table over bals. It starts nothing.
func NewServices(bals Balancers, cfg ServicesConfig) *Services {
	s := &Services{bals: bals, guard: cfg.Guard, observer: cfg.Observer, log: cfg.Logger}
	s.following.init(cfg)
	return s
}

// Lookup returns the published service of name, or nil.
func (s *Services) Lookup(name string) *Service {
	if v, ok := s.m.Load(name); ok {
		if sv := v.(*Service); sv.published.Load() {
			return sv
		}
	}
	return nil
}

// All yields every published service, each at most once (see
// sync.Map.Range on changes made meanwhile).
func (s *Services) All() iter.Seq[*Service] {
	return func(yield func(*Service) bool) {
		s.m.Range(func(_, v any) bool {
			sv := v.(*Service)
			return !sv.published.Load() || yield(sv)
		})
	}
}

// Names returns the names of the published services, sorted; empty, not
// nil, when there are none.
func (s *Services) Names() []string {
	names := []string{}
	for sv := range s.All() {
		names = append(names, sv.name)
	}
	slices.Sort(names)
	return names
}

// Unregistered counts the lists of services not followed that named no
// registered instance, and so built nothing.
func (s *Services) Unregistered() uint64 { return s.unregistered.Load() }

// Removed counts the services Unfollow removed.
func (s *Services) Removed() uint64 { return s.removed.Load() }

// Follow follows the service of name at once (a configured one: served
// from its static list, if it has one, until a pushed list takes it over)
// and returns it.
func (s *Services) Follow(name string) (*Service, error) {
	sv, err := s.follow(name)
	if err != nil {
		return nil, err
	}
	s.publish(sv)
	return sv, nil
}

// follow returns the service of name, building it, unpublished, on first
// use. Its balancer logs and counts the changes of a static list until a
// Visitor owns it.
func (s *Services) follow(name string) (*Service, error) {
	if v, ok := s.m.Load(name); ok {
		return v.(*Service), nil
	}
	s.mu.Lock()
	if v, ok := s.m.Load(name); ok {
		s.mu.Unlock()
		return v.(*Service), nil
	}
	b, err := s.bals.Get(name)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("lbvisitor: balancer for %q: %w", name, err)
	}
	sv := &Service{name: name, b: b}
	s.m.Store(name, sv)
	s.mu.Unlock()
	// Outside the lock: AddListener calls the listener at once.
	b.AddListener(func(old, new []*balancer.Server) {
		if sv.visitor.Load() == nil { // the Visitor tells its own changes
			s.changed(sv, configChange(name, old, new))
		}
	})
	return sv, nil
}

// publish makes sv seen by Lookup, requests and watchers, once.
func (s *Services) publish(sv *Service) {
	if sv.published.Swap(true) {
		return
	}
	s.following.settled(sv.name)
	s.watchers.namesChanged()
	s.watchers.listChanged(sv.name)
}

// Unfollow removes the published service of name when cond, called with
// it while no list is being applied to it and no service can be followed
// or unfollowed, returns true; it reports whether it did. The service's
// balancer is released (Balancers.Remove); a list that was waiting to be
// applied to it fails with ErrRemoved, and the next Handle for the service
// follows it anew.
func (s *Services) Unfollow(name string, cond func(*Service) bool) bool {
	s.mu.Lock()
	sv := s.Lookup(name)
	if sv == nil {
		s.mu.Unlock()
		return false
	}
	removed := false
	sv.whileIdle(func(v *Visitor) {
		if removed = cond(sv); removed {
			s.forget(sv, v)
		}
	})
	if removed && s.following.follower != nil {
		// Under s.mu: a Want of the service waits until it is done.
		if _, err := s.following.follower.Unfollow(name); err != nil {
			s.log.Warn().Err(err).Str("service", name).Msg("unfollow")
		}
	}
	s.mu.Unlock()
	if removed {
		s.removed.Add(1)
		s.watchers.namesChanged()
	}
	return removed
}

// ErrNoResolver is returned by Handle before Resolve was called.
var ErrNoResolver = errors.New("lbvisitor: no resolver: Services.Resolve was not called")

// Resolve gives the table the lookups that build servers from instance
// IDs (a *serverlist.Lookup, which reads the subscriber's mirror: hence
// given after the subscriber is built, before it starts). Call it once,
// before the first Handle.
func (s *Services) Resolve(res Resolver) { s.res.Store(&res) }

// Handle is the subscriber.Handler of the push path: lc goes to its
// service's Visitor. A service not followed yet is followed once one of
// lc's IDs resolves: a list naming a service or instances nobody
// registered builds nothing, so invented names cannot grow the table (such
// a list is counted in Unregistered and is not an error: if an instance
// registers later, the registry's change brings a new list). When no ID of
// a new service resolves because the registry could not be asked, Handle
// returns an error (the subscriber retries).
func (s *Services) Handle(ctx context.Context, lc events.ListChanged) error {
	res := s.res.Load()
	if res == nil {
		return ErrNoResolver
	}
	err := s.handle(ctx, *res, lc)
	if f := s.first.Load(); f != nil {
		f.handled(lc.Service)
	}
	return err
}

func (s *Services) handle(ctx context.Context, res Resolver, lc events.ListChanged) error {
	if _, ok := s.m.Load(lc.Service); !ok {
		if s.following.follower != nil && !s.following.isPending(lc.Service) {
			// A list of a service unfollowed meanwhile: not followed any
			// more, it builds nothing.
			s.unregistered.Add(1)
			return nil
		}
		err := resolvesAny(ctx, res, lc)
		if errors.Is(err, errNothingRegistered) {
			s.unregistered.Add(1)
			return nil
		}
		if err != nil {
			return err
		}
	}
	sv, err := s.follow(lc.Service)
	if err != nil {
		return err
	}
	err = s.visitor(sv, res).Apply(ctx, lc)
	if !sv.published.Load() && len(sv.b.AllServers()) == 0 {
		// Its first list installed nothing (every server invalid, or an
		// error): let it go; the next list follows it anew.
		s.drop(sv)
	}
	return err
}

// visitor returns sv's Visitor, building it on the first pushed list: from
// then on the Visitor owns the list (the balancer's polling stops).
func (s *Services) visitor(sv *Service, res Resolver) *Visitor {
	if v := sv.visitor.Load(); v != nil {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := sv.visitor.Load(); v != nil {
		return v
	}
	v := NewVisitor(sv.b, res, VisitorConfig{
		Guard:    s.guard,
		OnChange: func(lc ListChange) { s.changed(sv, lc) },
		Logger:   s.log,
	})
	sv.visitor.Store(v)
	return v
}

// drop forgets sv, never published, and releases its balancer.
func (s *Services) drop(sv *Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv.published.Load() {
		return
	}
	if cur, ok := s.m.Load(sv.name); ok && cur == sv {
		sv.whileIdle(func(v *Visitor) { s.forget(sv, v) })
	}
	s.following.settled(sv.name)
}

// whileIdle runs f while no list is being applied to sv (under its
// Visitor's lock; v is nil before sv's first pushed list).
func (sv *Service) whileIdle(f func(v *Visitor)) {
	v := sv.visitor.Load()
	if v == nil {
		f(nil)
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	f(v)
}

// forget removes sv from the table and releases its balancer; its
// Visitor, if any, refuses lists from now on. Called with s.mu held,
// through whileIdle.
func (s *Services) forget(sv *Service, v *Visitor) {
	if v != nil {
		v.removed = true
	}
	s.m.Delete(sv.name)
	s.bals.Remove(sv.name)
}

// changed counts, logs and tells lc, a change of sv's list, publishing sv
// at its first list. Changes of one service come one at a time (under its
// Visitor's lock, or the balancer's listener queue before it has one).
func (s *Services) changed(sv *Service, lc ListChange) {
	if len(lc.Joined) == 0 && len(lc.Left) == 0 && len(lc.Updated) == 0 {
		return
	}
	sv.updates.Add(1)
	sv.lastChange.Store(lc.At.UnixNano())
	if e := s.log.Info(); e.Enabled() {
		e.Str("service", sv.name).Array("joined", changesLog(lc.Joined)).Array("left", changesLog(lc.Left))
		if len(lc.Updated) > 0 {
			e.Array("updated", changesLog(lc.Updated))
		}
		e.Int("size", len(lc.Servers)).Msg("server list changed")
	}
	if s.observer != nil {
		s.observer(lc)
	}
	if !sv.published.Load() {
		s.publish(sv) // tells the watchers
		return
	}
	s.watchers.listChanged(sv.name)
}

// Balancers returns the balancer.Balancers requests use: a service the
// table does not follow is unknown (ErrUnknownService), so a made-up name
// never builds a balancer. A Get marks the service requested, which keeps
// the Janitor from removing it.
func (s *Services) Balancers() balancer.Balancers { return requests{s} }

type requests struct{ s *Services }

func (r requests) Get(name string) (*balancer.Balancer, error) {
	if sv := r.s.Lookup(name); sv != nil {
		sv.markRequested()
		return sv.b, nil
	}
	return nil, ErrUnknownService
}

// GetContext is Get that follows a service not followed yet (Want), when
// the table follows on demand.
func (r requests) GetContext(ctx context.Context, name string) (*balancer.Balancer, error) {
	sv, err := r.s.Want(ctx, name)
	if err != nil {
		return nil, err
	}
	return sv.b, nil
}

// markRequested marks sv requested: a load, and a store once per sweep.
func (sv *Service) markRequested() {
	if !sv.requested.Load() {
		sv.requested.Store(true)
	}
}

// errNothingRegistered: no ID of a new service is registered.
var errNothingRegistered = errors.New("lbvisitor: no instance registered")

// resolvesAny returns nil when at least one ID of lc resolves,
// errNothingRegistered when the registry holds none of them, or the
// lookups' error when it could not be asked.
func resolvesAny(ctx context.Context, res Resolver, lc events.ListChanged) error {
	if len(lc.InstanceIDs) == 0 {
		return errNothingRegistered
	}
	// The first ID alone first: it resolves in the usual case, and then the
	// others are not resolved twice (Apply resolves them all): at a
	// gateway's start with 100,000 instances, 30 MB less garbage. When it
	// does not, the others share a second retry schedule (35 ms more at
	// worst with the default lookup).
	var outage error
	for _, ids := range [][]string{lc.InstanceIDs[:1], lc.InstanceIDs[1:]} {
		if len(ids) == 0 {
			break
		}
		_, errs := res.ResolveEach(ctx, lc.Service, ids)
		for _, err := range errs {
			switch {
			case err == nil:
				return nil
			case !errors.Is(err, serverlist.ErrNotFound) && outage == nil:
				outage = err
			}
		}
	}
	if outage != nil {
		return fmt.Errorf("lbvisitor: %s: %w", lc.Service, outage)
	}
	return errNothingRegistered
}

var _ balancer.ContextBalancers = requests{}
