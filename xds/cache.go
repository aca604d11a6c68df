package pushlbxds

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// errFetch is what a REST or one-shot fetch gets: only streams are served.
var errFetch = errors.New("pushlbxds: fetch is not supported; open an ADS stream")

// zonedCache is the server's cache.Cache: one LinearCache per resource
// type, and for ClusterLoadAssignments one LinearCache per client
// locality (the region and zone of the request's node), since priorities
// depend on it. The caches of localities are made when a client of a new
// one asks, from the current lists, up to a bound; clients of further
// localities get the ClusterLoadAssignments of a client without one.
//
// Lock order: mu, then a LinearCache's own lock. Watches are created
// without holding mu.
type zonedCache struct {
	lds, rds, cds *cache.LinearCache
	prefix        string // version prefix of every cache
	maxZones      int
	onZone        func(loc clientLocality, admitted bool) // told of each new locality; under mu

	mu    sync.Mutex
	lists map[string][]endpoint                 // the services' current lists
	eds   map[clientLocality]*cache.LinearCache // by client locality; the zero one for clients without one
	build func(service string, eps []endpoint, loc clientLocality) types.Resource
}

// newZonedCache returns the caches with no resource. build makes the
// ClusterLoadAssignment of a service for a client zone, or nil when it
// cannot (the previous one then stays).
func newZonedCache(prefix string, maxZones int, build func(string, []endpoint, clientLocality) types.Resource, onZone func(clientLocality, bool)) *zonedCache {
	z := &zonedCache{
		lds:      cache.NewLinearCache(resource.ListenerType, cache.WithVersionPrefix(prefix)),
		rds:      cache.NewLinearCache(resource.RouteType, cache.WithVersionPrefix(prefix)),
		cds:      cache.NewLinearCache(resource.ClusterType, cache.WithVersionPrefix(prefix)),
		prefix:   prefix,
		maxZones: maxZones,
		onZone:   onZone,
		lists:    map[string][]endpoint{},
		eds:      map[clientLocality]*cache.LinearCache{},
		build:    build,
	}
	z.eds[clientLocality{}] = cache.NewLinearCache(resource.EndpointType, cache.WithVersionPrefix(prefix+"z0-"))
	return z
}

// zoneCache returns the ClusterLoadAssignment cache of clients at loc,
// making it from the current lists the first time.
func (z *zonedCache) zoneCache(loc clientLocality) *cache.LinearCache {
	z.mu.Lock()
	defer z.mu.Unlock()
	if c, ok := z.eds[loc]; ok {
		return c
	}
	if len(z.eds) > z.maxZones { // the zero locality does not count
		z.onZone(loc, false)
		return z.eds[clientLocality{}]
	}
	// A list whose resource cannot be built for zone (never seen: the
	// resources are validated) gets the one of clients without a zone.
	initial := make(map[string]types.Resource, len(z.lists))
	var neutral map[string]types.Resource
	for service, eps := range z.lists {
		if r := z.build(service, eps, loc); r != nil {
			initial[service] = r
			continue
		}
		if neutral == nil {
			neutral = z.eds[clientLocality{}].GetResources()
		}
		if r, ok := neutral[service]; ok {
			initial[service] = r
		}
	}
	c := cache.NewLinearCache(resource.EndpointType, cache.WithVersionPrefix(z.prefix+"z"+strconv.Itoa(len(z.eds))+"-"),
		cache.WithInitialResources(initial))
	z.eds[loc] = c
	z.onZone(loc, true)
	return c
}

// setList installs a service's list: its ClusterLoadAssignment for every
// client zone. It returns whether every one was built.
func (z *zonedCache) setList(service string, eps []endpoint) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.lists[service] = eps
	ok := true
	for loc, c := range z.eds {
		r := z.build(service, eps, loc)
		if r == nil {
			ok = false
			continue
		}
		c.UpdateResource(service, r) // errors only for a nil resource
	}
	return ok
}

// setService installs (r != nil) or removes the service's Listener,
// RouteConfiguration and Cluster. They are installed after its
// ClusterLoadAssignments and removed before them, in the order a client
// follows them, so that no resource names one that is missing.
func (z *zonedCache) setService(service string, l, r, c types.Resource) {
	if l != nil {
		z.cds.UpdateResource(service, c)
		z.rds.UpdateResource(service, r)
		z.lds.UpdateResource(service, l)
		return
	}
	z.lds.DeleteResource(service)
	z.rds.DeleteResource(service)
	z.cds.DeleteResource(service)
}

// removeList removes the service's ClusterLoadAssignments.
func (z *zonedCache) removeList(service string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	delete(z.lists, service)
	for _, c := range z.eds {
		c.DeleteResource(service)
	}
}

// zones returns the number of client localities with a cache of their own.
func (z *zonedCache) zones() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return len(z.eds) - 1
}

// typeCache returns the cache of a type URL and a client locality, or nil
// for a type this server does not serve.
func (z *zonedCache) typeCache(typeURL string, loc clientLocality) *cache.LinearCache {
	switch typeURL {
	case resource.ListenerType:
		return z.lds
	case resource.RouteType:
		return z.rds
	case resource.ClusterType:
		return z.cds
	case resource.EndpointType:
		return z.zoneCache(loc)
	}
	return nil
}

// CreateWatch implements cache.ConfigWatcher. A type this server does not
// serve gets a watch that never answers, so that the stream stays open for
// the types it does.
func (z *zonedCache) CreateWatch(req *cache.Request, sub cache.Subscription, ch chan cache.Response) (func(), error) {
	c := z.typeCache(req.GetTypeUrl(), localityOf(req.GetNode().GetLocality().GetRegion(), req.GetNode().GetLocality().GetZone()))
	if c == nil {
		return func() {}, nil
	}
	return c.CreateWatch(req, sub, ch)
}

// CreateDeltaWatch implements cache.ConfigWatcher, as CreateWatch.
func (z *zonedCache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	c := z.typeCache(req.GetTypeUrl(), localityOf(req.GetNode().GetLocality().GetRegion(), req.GetNode().GetLocality().GetZone()))
	if c == nil {
		return func() {}, nil
	}
	return c.CreateDeltaWatch(req, sub, ch)
}

// Fetch implements cache.ConfigFetcher: not supported.
func (z *zonedCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errFetch
}

var _ cache.Cache = (*zonedCache)(nil)
