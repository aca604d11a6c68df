package gateway

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
)

// tracked is a balancer with what the admin page and the logs show about
// its list changes.
type tracked struct {
	b          *balancer.Balancer
	updates    atomic.Uint64
	lastChange atomic.Int64 // unix nanos
}

// balancers wraps the factory: on first use of a service it adds the
// listener that logs every list change (one info line: service, added,
// removed, size) and counts updates.
type balancers struct {
	f   *balancer.Factory
	log zerolog.Logger
	// onNew, if set, is called once for every new service.
	onNew func(service string)

	mu sync.Mutex
	m  map[string]*tracked
}

func newBalancers(f *balancer.Factory, log zerolog.Logger) *balancers {
	return &balancers{f: f, log: log, m: map[string]*tracked{}}
}

// Get implements lbvisitor.Balancers and lbhttp's balancer source.
func (bs *balancers) Get(name string) (*balancer.Balancer, error) {
	bs.mu.Lock()
	if t := bs.m[name]; t != nil {
		bs.mu.Unlock()
		return t.b, nil
	}
	bs.mu.Unlock()
	b, err := bs.f.Get(name)
	if err != nil {
		return nil, err
	}
	bs.mu.Lock()
	t := bs.m[name]
	created := t == nil
	if created {
		t = &tracked{b: b}
		bs.m[name] = t
	}
	bs.mu.Unlock()
	if created {
		if bs.onNew != nil {
			bs.onNew(name)
		}
		b.AddListener(func(old, new []*balancer.Server) { bs.changed(name, t, old, new) })
	}
	return b, nil
}

// lookup returns the tracked balancer of a service, or nil.
func (bs *balancers) lookup(name string) *tracked {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return bs.m[name]
}

// all returns the tracked balancers by name.
func (bs *balancers) all() map[string]*tracked {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	out := make(map[string]*tracked, len(bs.m))
	for k, v := range bs.m {
		out[k] = v
	}
	return out
}

func (bs *balancers) changed(service string, t *tracked, old, new []*balancer.Server) {
	if len(old) == 0 && len(new) == 0 {
		return
	}
	t.updates.Add(1)
	t.lastChange.Store(time.Now().UnixNano())
	before := make(map[string]bool, len(old))
	for _, s := range old {
		before[s.ID] = true
	}
	var added, removed []string
	for _, s := range new {
		if !before[s.ID] {
			added = append(added, s.ID)
		}
		delete(before, s.ID)
	}
	for id := range before {
		removed = append(removed, id)
	}
	bs.log.Info().Str("service", service).Strs("added", added).Strs("removed", removed).Int("size", len(new)).Msg("server list changed")
}
