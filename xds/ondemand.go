package pushlbxds

// On demand: over a client that follows on request
// (pushlb.FollowRequested), the names the xDS streams subscribe to are
// the services they ask for, and the server serves those only. A name no
// followed service has is followed in the background (Client.Follow: the
// client bounds each wait and the follows under way, and remembers for
// 2 s a name the registry does not hold; a name that fails is tried again
// every touchEvery while a stream subscribes to it). Once followed, the
// service's resources are installed as any service's are, and the streams
// waiting for them receive them. The server watches (Client.Watch) the
// services some stream subscribes to, and a watch is a standing request:
// such a service stays followed, and one no stream subscribes to any more
// loses its resources and is unfollowed after the client's IdleUnfollow
// (or its services that a request or the configuration keeps stay). A
// wildcard subscription (Envoy's Listeners and Clusters) gets the
// services some stream names, not the fleet: Envoy needs FollowAll.

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// maxDemandFollows bounds the follows the server runs at once for the
// streams; a name beyond it is counted (Stats.FollowsRefused) and
// followed at the next touch if a stream still subscribes to it.
const maxDemandFollows = 64

// demand is what the streams subscribe to, for a server on demand.
//
// Threading: the xDS callbacks (any goroutine) and the touch goroutine
// call its methods; mu guards the maps.
type demand struct {
	mu      sync.Mutex
	streams map[int64]map[string]map[string]bool // stream -> type URL -> names
	asking  map[string]bool                      // names being followed
}

func newDemand() *demand {
	return &demand{streams: map[int64]map[string]map[string]bool{}, asking: map[string]bool{}}
}

// namesOf returns the names one stream subscribes to of one type, made
// when missing. mu is held.
func (d *demand) namesOf(stream int64, typeURL string) map[string]bool {
	if d.streams[stream] == nil {
		d.streams[stream] = map[string]map[string]bool{}
	}
	m := d.streams[stream][typeURL]
	if m == nil {
		m = map[string]bool{}
		d.streams[stream][typeURL] = m
	}
	return m
}

// set records a state-of-the-world request: the names of one type the
// stream subscribes to now (none: a wildcard, or nothing).
func (d *demand) set(stream int64, typeURL string, names []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.namesOf(stream, typeURL)
	clear(m)
	for _, n := range names {
		m[n] = true
	}
}

// change records a delta request: names subscribed to and unsubscribed
// from, of one type.
func (d *demand) change(stream int64, typeURL string, sub, unsub []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.namesOf(stream, typeURL)
	for _, n := range sub {
		m[n] = true
	}
	for _, n := range unsub {
		delete(m, n)
	}
}

// closed forgets a stream.
func (d *demand) closed(stream int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.streams, stream)
}

// names returns every name a stream subscribes to, once each, sorted.
func (d *demand) names() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	set := map[string]bool{}
	for _, types := range d.streams {
		for _, names := range types {
			for n := range names {
				if n != "*" { // a delta wildcard
					set[n] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// take marks name as being followed, unless it is already or
// maxDemandFollows are; it reports whether the caller follows it.
func (d *demand) take(name string) (ok, refused bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.asking[name] {
		return false, false
	}
	if len(d.asking) >= maxDemandFollows {
		return false, true
	}
	d.asking[name] = true
	return true, false
}

// done ends take.
func (d *demand) done(name string) {
	d.mu.Lock()
	delete(d.asking, name)
	d.mu.Unlock()
}

// demandChanged tells the feed that the subscribed names may have
// changed.
func (s *Server) demandChanged() {
	s.mu.Lock()
	s.demandMoved = true
	s.mu.Unlock()
	s.signal()
}

// served returns the services of names the server serves: all of them,
// or on demand those some stream subscribes to.
func (s *Server) served(names []string) []string {
	if s.demand == nil {
		return names
	}
	wanted := s.demand.names()
	out := make([]string, 0, len(wanted))
	for _, n := range names {
		if _, ok := slices.BinarySearch(wanted, n); ok {
			out = append(out, n)
		}
	}
	return out
}

// want follows, in the background, each of names the client does not
// follow yet. It is a no-op for a server that is not on demand.
func (s *Server) want(names []string) {
	if s.demand == nil {
		return
	}
	for _, name := range names {
		if name == "" || name == "*" {
			continue
		}
		if _, err := s.c.Balancer(name); err == nil {
			continue // followed
		}
		ok, refused := s.demand.take(name)
		if refused {
			s.followsRefused.Add(1)
		}
		if !ok {
			continue
		}
		s.lifeMu.Lock()
		if s.stopped {
			s.lifeMu.Unlock()
			s.demand.done(name)
			return
		}
		s.wg.Add(1)
		s.lifeMu.Unlock()
		go func() {
			defer s.wg.Done()
			defer s.demand.done(name)
			if _, err := s.c.Follow(s.ctx, name); err != nil {
				s.followsFailed.Add(1)
				s.o.log.Debug().Err(err).Str("service", name).Msg("xds: a name a client asked for is not followed")
				return
			}
			s.follows.Add(1)
		}()
	}
}

// retryEvery is how often the server follows again the subscribed names
// it could not: the time the client remembers a name the registry does not
// hold, so that a service announced after a stream asked for it is served
// within about that.
const retryEvery = 2 * time.Second

// retry follows, until Stop, the subscribed names not followed yet.
func (s *Server) retry() {
	t := time.NewTicker(retryEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		var missing []string
		for _, name := range s.demand.names() {
			if _, err := s.c.Balancer(name); err != nil {
				missing = append(missing, name)
			}
		}
		s.want(missing)
	}
}
