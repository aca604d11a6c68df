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
//
// In a table that follows on demand (ServicesConfig.Follower), a watch is
// an interest in the service: the table follows it, whether the registry
// holds it yet or not (its list is empty until something announces it),
// and does not unfollow it while it is watched.
func (s *Services) Watch(service string, f func(servers []*balancer.Server)) (stop func()) {
	if s.following.follower != nil && s.Lookup(service) == nil {
		s.pin(service)
	}
	return s.watchers.start(&s.watchers.lists, service, s, func() {
		var servers []*balancer.Server
		if sv := s.Lookup(service); sv != nil {
			servers = append(servers, sv.b.AllServers()...)
		}
		f(servers)
	})
}

// WatchNames calls f with the names of the followed services, sorted as
// Names returns them, at once and again after each time one is published
// (its first list) or unfollowed, until stop is called. The call rules are
// Watch's; the slice is f's own.
func (s *Services) WatchNames(f func(services []string)) (stop func()) {
	return s.watchers.start(&s.watchers.names, "", s, func() { f(s.Names()) })
}

// watch is one Watch or WatchNames: call reads what it watches and hands
// it to the watcher's function.
type watch struct {
	call    func()
	mu      sync.Mutex // serialises the calls
	stopped atomic.Bool
}

// deliver calls the watch's function, unless the watch was stopped.
func (w *watch) deliver() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped.Load() {
		w.call()
	}
}

// watchers are a table's watches, by service ("" for the names').
type watchers struct {
	mu    sync.Mutex
	lists map[string]map[*watch]struct{}
	names map[string]map[*watch]struct{}
}

// start registers a watch of call under set[key], delivers once, and
// returns its stop: no call begins after stop returns (one already past
// its check may finish).
func (ws *watchers) start(set *map[string]map[*watch]struct{}, key string, s *Services, call func()) (stop func()) {
	w := &watch{call: call}
	ws.mu.Lock()
	if *set == nil {
		*set = map[string]map[*watch]struct{}{}
	}
	if (*set)[key] == nil {
		(*set)[key] = map[*watch]struct{}{}
	}
	(*set)[key][w] = struct{}{}
	ws.mu.Unlock()
	w.deliver()
	return func() {
		w.stopped.Store(true)
		ws.mu.Lock()
		defer ws.mu.Unlock()
		delete((*set)[key], w)
		if len((*set)[key]) == 0 {
			delete(*set, key)
		}
	}
}

// watched reports whether service has a list watcher.
func (ws *watchers) watched(service string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.lists[service]) > 0
}

// listChanged tells the watchers of service that its list changed.
func (ws *watchers) listChanged(service string) { ws.deliver(&ws.lists, service) }

// namesChanged tells the names' watchers that a service was published or
// unfollowed. Call it without holding Services.mu.
func (ws *watchers) namesChanged() { ws.deliver(&ws.names, "") }

// deliver calls, outside the lock, every watch of set[key].
func (ws *watchers) deliver(set *map[string]map[*watch]struct{}, key string) {
	ws.mu.Lock()
	list := make([]*watch, 0, len((*set)[key]))
	for w := range (*set)[key] {
		list = append(list, w)
	}
	ws.mu.Unlock()
	for _, w := range list {
		w.deliver()
	}
}
