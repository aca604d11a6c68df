package lbvisitor

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Janitor unfollows the services gone from the registry: a service that
// no configuration names, whose list has been empty for a whole grace
// period and that no request asked for meanwhile. Without it, a stream of
// announcements for invented or retired services would grow the table
// (balancers, their stats, metric series) without bound.
//
// It owns one goroutine, from Start to Close.
type Janitor struct {
	services *Services
	grace    time.Duration
	every    time.Duration
	keep     map[string]bool // configured services: never removed
	log      zerolog.Logger

	emptySince map[string]time.Time // the janitor goroutine's own

	stop chan struct{}
	wg   sync.WaitGroup
}

// NewJanitor builds a janitor of services that removes a service after
// grace, never one of keep. It starts nothing.
func NewJanitor(services *Services, grace time.Duration, keep []string, log zerolog.Logger) *Janitor {
	k := make(map[string]bool, len(keep))
	for _, name := range keep {
		k[name] = true
	}
	return &Janitor{
		services: services, grace: grace, keep: k, log: log,
		every:      min(max(grace/4, 10*time.Millisecond), 30*time.Second),
		emptySince: map[string]time.Time{}, stop: make(chan struct{}),
	}
}

// Start starts the sweeps, one every quarter of the grace period (10 ms
// to 30 s).
func (j *Janitor) Start() {
	j.wg.Go(func() {
		t := time.NewTicker(j.every)
		defer t.Stop()
		for {
			select {
			case <-j.stop:
				return
			case now := <-t.C:
				j.sweep(now)
			}
		}
	})
}

// Close stops the sweeps and waits for the goroutine. Call it once.
func (j *Janitor) Close() {
	close(j.stop)
	j.wg.Wait()
}

// sweep looks at every service once.
func (j *Janitor) sweep(now time.Time) {
	for sv := range j.services.All() {
		name := sv.name
		requested := sv.requested.Swap(false)
		if j.keep[name] || requested || len(sv.b.AllServers()) > 0 {
			delete(j.emptySince, name)
			continue
		}
		since, ok := j.emptySince[name]
		if !ok {
			j.emptySince[name] = now
			continue
		}
		if now.Sub(since) < j.grace {
			continue
		}
		delete(j.emptySince, name)
		// Unfollow checks again while no list is being applied.
		if j.services.Unfollow(name, func(sv *Service) bool { return len(sv.b.AllServers()) == 0 }) {
			j.log.Info().Str("service", name).Stringer("grace", j.grace).Msg("service removed: no instance and no request for the grace period")
		}
	}
	for name := range j.emptySince {
		if j.services.Lookup(name) == nil {
			delete(j.emptySince, name)
		}
	}
}
