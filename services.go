package pushlb

import (
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
)

// service is one service's balancer with what Stats reports about its list
// changes.
type service struct {
	name       string
	b          *balancer.Balancer
	updates    atomic.Uint64
	lastChange atomic.Int64 // unix nanos; 0 before the first change
	requested  atomic.Bool  // set by requests, cleared by each janitor sweep
}

// serviceSet holds the balancers by service name. Reads (every request)
// take no lock (a sync.Map's load); creations are serialised by mu. A
// copy-on-write map copied itself for each new service: some 20 MB of
// garbage at the start of a gateway with 1,000 services (docs/perf.md,
// "Cold start, third pass").
type serviceSet struct {
	factory *balancer.Factory
	log     zerolog.Logger
	observe ListObserver // may be nil
	causes  sync.Map     // service -> the events.ListChanged being applied, for its causes

	watchMu          sync.Mutex // guards watchers and servicesWatchers
	watchers         map[string]map[*watcher]struct{}
	servicesWatchers map[*servicesWatcher]struct{}

	mu sync.Mutex // serialises creations and removals
	m  sync.Map   // service name -> *service
}

func newServiceSet(f *balancer.Factory, log zerolog.Logger, observe ListObserver) *serviceSet {
	return &serviceSet{factory: f, log: log, observe: observe}
}

// lookup returns the service's entry, or nil.
func (s *serviceSet) lookup(name string) *service {
	if v, ok := s.m.Load(name); ok {
		return v.(*service)
	}
	return nil
}

// all yields every service's entry, each at most once (see sync.Map.Range
// on changes made meanwhile).
func (s *serviceSet) all() iter.Seq2[string, *service] {
	return func(yield func(string, *service) bool) {
		s.m.Range(func(k, v any) bool { return yield(k.(string), v.(*service)) })
	}
}

// create returns the service's entry, building its balancer on first use.
// The new balancer logs and counts its list changes from then on.
func (s *serviceSet) create(name string) (*service, error) {
	if sv := s.lookup(name); sv != nil {
		return sv, nil
	}
	s.mu.Lock()
	if sv := s.lookup(name); sv != nil {
		s.mu.Unlock()
		return sv, nil
	}
	b, err := s.factory.Get(name)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	sv := &service{name: name, b: b}
	s.m.Store(name, sv)
	s.mu.Unlock()
	// Outside the lock: AddListener calls the listener at once, and the
	// watchers of the names run their functions.
	b.AddListener(sv.changed(s))
	s.notifyServicesWatchers()
	return sv, nil
}

// remove forgets the service's entry; the caller closes its balancer.
func (s *serviceSet) remove(name string) {
	s.mu.Lock()
	_, had := s.m.LoadAndDelete(name)
	s.mu.Unlock()
	if !had {
		return
	}
	s.notifyServicesWatchers()
}

// changed returns the listener that counts the service's list changes and
// logs each one (service, added and removed IDs with their causes, new
// size), then tells the observer, if any. The causes come from the
// ListChanged being applied (setCauses); a change the push path did not
// make is a static list's (config).
func (sv *service) changed(set *serviceSet) balancer.Listener {
	return func(old, new []*balancer.Server) {
		if len(old) == 0 && len(new) == 0 {
			return
		}
		sv.updates.Add(1)
		sv.lastChange.Store(time.Now().UnixNano())
		fallback := events.CauseConfig
		var cm map[string]events.Change
		if pushed, ok := set.causes.Load(sv.name); ok {
			// A list the push path applies: an instance without a recorded
			// cause changed for the list's own, or else with its registry
			// record.
			lc := pushed.(events.ListChanged)
			fallback, cm = events.CauseRegistry, lc.Changes
			if lc.Cause != "" {
				fallback = lc.Cause
			}
		}
		lc := listChange(sv.name, old, new, cm, fallback)
		if e := set.log.Info(); e.Enabled() {
			e.Str("service", sv.name).Array("joined", changesLog(lc.Joined)).Array("left", changesLog(lc.Left)).
				Int("size", len(new)).Msg("server list changed")
		}
		if set.observe != nil {
			set.observe(lc)
		}
		set.notifyWatchers(sv.name)
	}
}

// setCauses hands the ListChanged about to be applied to its service's
// listener, which runs during the apply on the same goroutine (deliveries
// of one service never overlap) and reads its causes; clearCauses takes it
// back once it is done.
func (s *serviceSet) setCauses(lc events.ListChanged) { s.causes.Store(lc.Service, lc) }

func (s *serviceSet) clearCauses(service string) { s.causes.Delete(service) }

// changesLog logs server changes as "id (cause)".
type changesLog []ServerChange

func (c changesLog) MarshalZerologArray(a *zerolog.Array) {
	for _, ch := range c {
		a.Str(ch.Server.ID + " (" + string(ch.Cause) + ")")
	}
}

// creating is the balancer.Balancers the push path uses: it builds a
// balancer for a service the first time the service's list arrives.
type creating struct{ set *serviceSet }

func (c creating) Get(name string) (*balancer.Balancer, error) {
	sv, err := c.set.create(name)
	if err != nil {
		return nil, err
	}
	return sv.b, nil
}

// existing is the balancer.Balancers requests use: a service nobody
// announced or configured is unknown, so a made-up name never builds a
// balancer.
type existing struct{ set *serviceSet }

func (e existing) Get(name string) (*balancer.Balancer, error) {
	if sv := e.set.lookup(name); sv != nil {
		if !sv.requested.Load() { // a load, and a store once per sweep
			sv.requested.Store(true)
		}
		return sv.b, nil
	}
	return nil, ErrUnknownService
}

var (
	_ balancer.Balancers = creating{}
	_ balancer.Balancers = existing{}
)

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
