package lbvisitor

import (
	"sync"
	"sync/atomic"

	"github.com/pushlb/pushlb/balancer"
)

// Watch calls f with the current server list of service at once, and again
// after each change of that list, until stop is called. The list is empty
// while the table does not follow the service (nothing announced it yet)
// and when its last instance left.
//
// Each call reads the list as it is when the call runs, so a call is never
// older than the one before it; the same list may come twice. Calls for
// one watch never overlap. f runs on the goroutine that applied the change
// (or on Watch's caller for the first call), so it must be quick and must
// not block; it may call stop. stop does not wait for a call in progress
// (so that f may call it): a call already past its start may still run,
// none begins after. The slice is f's own; the servers are the balancer's
// (read them, do not modify them).
func (s *Services) Watch(service string, f func(servers []*balancer.Server)) (stop func()) {
	w := &listWatch{service: service, f: f}
	s.watchers.add(&s.watchers.lists, w, service)
	w.deliver(s)
	return func() { w.stopped.Store(true); s.watchers.remove(&s.watchers.lists, w, service) }
}

// WatchNames calls f with the names of the followed services, sorted as
// Names returns them, at once and again after each time one is published
// (its first list) or unfollowed, until stop is called. The call rules are
// Watch's; the slice is f's own.
func (s *Services) WatchNames(f func(services []string)) (stop func()) {
	w := &namesWatch{f: f}
	s.watchers.add(&s.watchers.names, w, "")
	w.deliver(s)
	return func() { w.stopped.Store(true); s.watchers.remove(&s.watchers.names, w, "") }
}

// watcher is one Watch or WatchNames.
type watcher interface{ deliver(s *Services) }

// watchers are a table's watches, by service ("" for the names').
type watchers struct {
	mu    sync.Mutex
	lists map[string]map[watcher]struct{}
	names map[string]map[watcher]struct{}
}

func (ws *watchers) add(set *map[string]map[watcher]struct{}, w watcher, key string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if *set == nil {
		*set = map[string]map[watcher]struct{}{}
	}
	if (*set)[key] == nil {
		(*set)[key] = map[watcher]struct{}{}
	}
	(*set)[key][w] = struct{}{}
}

// remove ends w: no call begins after it returns (one already past its
// check may finish).
func (ws *watchers) remove(set *map[string]map[watcher]struct{}, w watcher, key string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete((*set)[key], w)
	if len((*set)[key]) == 0 {
		delete(*set, key)
	}
}

// listChanged tells the watchers of service that its list changed.
func (ws *watchers) listChanged(service string, s *Services) { ws.deliver(&ws.lists, service, s) }

// namesChanged tells the names' watchers that a service was published or
// unfollowed. Call it without holding Services.mu.
func (ws *watchers) namesChanged(s *Services) { ws.deliver(&ws.names, "", s) }

// deliver calls, outside the lock, every watcher of set[key].
func (ws *watchers) deliver(set *map[string]map[watcher]struct{}, key string, s *Services) {
	ws.mu.Lock()
	if len((*set)[key]) == 0 {
		ws.mu.Unlock()
		return
	}
	list := make([]watcher, 0, len((*set)[key]))
	for w := range (*set)[key] {
		list = append(list, w)
	}
	ws.mu.Unlock()
	for _, w := range list {
		w.deliver(s)
	}
}

// listWatch is one Watch.
type listWatch struct {
	service string
	f       func([]*balancer.Server)
	mu      sync.Mutex // serialises the calls of f
	stopped atomic.Bool
}

func (w *listWatch) deliver(s *Services) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped.Load() {
		return
	}
	var servers []*balancer.Server
	if sv := s.Lookup(w.service); sv != nil {
		servers = append(servers, sv.b.AllServers()...)
	}
	w.f(servers)
}

// namesWatch is one WatchNames.
type namesWatch struct {
	f       func([]string)
	mu      sync.Mutex // serialises the calls of f
	stopped atomic.Bool
}

func (w *namesWatch) deliver(s *Services) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped.Load() {
		return
	}
	w.f(s.Names())
}
