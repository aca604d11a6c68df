package pushlb

import (
	"sync"
	"sync/atomic"

	"github.com/pushlb/pushlb/balancer"
)

// Watch calls f with the current server list of service at once, and again
// after each change of that list, until stop is called: the way an adapter
// (a gRPC resolver, a proxy's upstream source) follows one service's pushed
// list without polling. The list is empty while the client has no balancer
// for the service (nothing announced it yet) and when its last instance
// left.
//
// Each call reads the list as it is when the call runs, so a call is never
// older than the one before it; the same list may come twice. Calls for
// one watch never overlap. f runs on the goroutine that applied the change
// (or on Watch's caller for the first call), so it must be quick and must
// not block; it may call stop. stop does not wait for a call in progress
// (so that f may call it): a call already past its start may still run,
// none begins after. The slice is f's own; the servers are the balancer's
// (read them, do not modify them). Watch works before Start and after
// Close (the lists then stay as they are).
func (c *Client) Watch(service string, f func(servers []*balancer.Server)) (stop func()) {
	w := &watcher{service: service, f: f, set: c.services}
	c.services.addWatcher(w)
	w.deliver()
	return func() { c.services.removeWatcher(w) }
}

// watcher is one Watch.
type watcher struct {
	service string
	f       func([]*balancer.Server)
	set     *serviceSet

	mu      sync.Mutex // serialises the calls of f
	stopped atomic.Bool
}

// deliver calls f with the service's current list, unless the watch was
// stopped.
func (w *watcher) deliver() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped.Load() {
		return
	}
	var servers []*balancer.Server
	if sv := w.set.lookup(w.service); sv != nil {
		servers = append(servers, sv.b.AllServers()...)
	}
	w.f(servers)
}

// addWatcher registers w for its service's changes.
func (s *serviceSet) addWatcher(w *watcher) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watchers == nil {
		s.watchers = map[string]map[*watcher]struct{}{}
	}
	if s.watchers[w.service] == nil {
		s.watchers[w.service] = map[*watcher]struct{}{}
	}
	s.watchers[w.service][w] = struct{}{}
}

// removeWatcher ends w: no call of f begins after it returns (one already
// past its check may finish).
func (s *serviceSet) removeWatcher(w *watcher) {
	w.stopped.Store(true)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	delete(s.watchers[w.service], w)
	if len(s.watchers[w.service]) == 0 {
		delete(s.watchers, w.service)
	}
}

// notifyWatchers tells the watchers of service that its list changed.
func (s *serviceSet) notifyWatchers(service string) {
	s.watchMu.Lock()
	ws := make([]*watcher, 0, len(s.watchers[service]))
	for w := range s.watchers[service] {
		ws = append(ws, w)
	}
	s.watchMu.Unlock()
	for _, w := range ws {
		w.deliver()
	}
}

// WatchServices calls f with the names of the services the client has a
// balancer for, sorted as Services returns them, at once and again after
// each time one is added (its first announcement, or a configured service
// at Start) or removed (gone for Config.ServiceGrace), until stop is
// called: the way an adapter that serves every service (the xds module's
// control plane) learns of a new one without polling. Follow each
// service's list with Watch.
//
// The call rules are Watch's: each call reads the names as they are when
// it runs, so it is never older than the one before it, and the same
// names may come twice; calls never overlap; f runs on the goroutine that
// added or removed the service (or on WatchServices' caller for the first
// call), so it must be quick and must not block, and it may call stop,
// after which no call begins. The slice is f's own.
func (c *Client) WatchServices(f func(services []string)) (stop func()) {
	w := &servicesWatcher{f: f, c: c}
	c.services.addServicesWatcher(w)
	w.deliver()
	return func() { c.services.removeServicesWatcher(w) }
}

// servicesWatcher is one WatchServices.
type servicesWatcher struct {
	f func([]string)
	c *Client

	mu      sync.Mutex // serialises the calls of f
	stopped atomic.Bool
}

// deliver calls f with the current names, unless the watch was stopped.
func (w *servicesWatcher) deliver() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped.Load() {
		return
	}
	w.f(w.c.Services())
}

func (s *serviceSet) addServicesWatcher(w *servicesWatcher) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.servicesWatchers == nil {
		s.servicesWatchers = map[*servicesWatcher]struct{}{}
	}
	s.servicesWatchers[w] = struct{}{}
}

func (s *serviceSet) removeServicesWatcher(w *servicesWatcher) {
	w.stopped.Store(true)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	delete(s.servicesWatchers, w)
}

// notifyServicesWatchers tells the WatchServices watchers that a service
// was added or removed. Call it without holding mu.
func (s *serviceSet) notifyServicesWatchers() {
	s.watchMu.Lock()
	ws := make([]*servicesWatcher, 0, len(s.servicesWatchers))
	for w := range s.servicesWatchers {
		ws = append(ws, w)
	}
	s.watchMu.Unlock()
	for _, w := range ws {
		w.deliver()
	}
}
