package lbvisitor

import (
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Janitor unfollows the services a client no longer needs:
//   - a service gone from the registry: one that no configuration names,
//     whose list has been empty for a whole grace period and that no
//     request asked for meanwhile. Without it, a stream of announcements
//     for invented or retired services would grow the table (balancers,
//     their stats, metric series) without bound;
//   - with JanitorConfig.Idle, a live service followed on demand
//     (Services.Want) that no request asked for during Idle.
//
// It owns one goroutine, from Start to Close.
type Janitor struct {
	services *Services
	grace    time.Duration
	idle     time.Duration
	every    time.Duration
	keep     map[string]bool // configured services: never removed
	log      zerolog.Logger

	// The janitor goroutine's own.
	emptySince    map[string]time.Time
	lastRequested map[string]time.Time

	stop chan struct{}
	wg   sync.WaitGroup
}

// JanitorConfig is what a Janitor is built with.
type JanitorConfig struct {
	// Grace is how long a service stays followed once empty and
	// unrequested.
	Grace time.Duration
	// Idle, when positive, is how long a live service that no
	// configuration names stays followed without a request, in a table
	// that follows on demand (ServicesConfig.Follower; ignored otherwise);
	// zero keeps live services.
	Idle time.Duration
	// Keep are the configured services, never removed.
	Keep   []string
	Logger zerolog.Logger
}

// NewJanitor builds a janitor of services. It starts nothing.
func NewJanitor(services *Services, cfg JanitorConfig) *Janitor {
	k := make(map[string]bool, len(cfg.Keep))
	for _, name := range cfg.Keep {
		k[name] = true
	}
	if services.following.follower == nil {
		cfg.Idle = 0 // what it unfollowed, the next list would follow again
	}
	every := cfg.Grace
	if cfg.Idle > 0 {
		every = min(every, cfg.Idle)
	}
	return &Janitor{
		services: services, grace: cfg.Grace, idle: cfg.Idle, keep: k, log: cfg.Logger,
		every:      min(max(every/4, 10*time.Millisecond), 30*time.Second),
		emptySince: map[string]time.Time{}, lastRequested: map[string]time.Time{}, stop: make(chan struct{}),
	}
}

// Start starts the sweeps, one every quarter of the grace period or of
// the idle window, whichever is shorter (10 ms to 30 s).
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
		if requested {
			j.lastRequested[name] = now
		}
		if j.keep[name] {
			continue
		}
		if j.services.watchers.watched(name) {
			j.lastRequested[name] = now // a watch is a standing request
		}
		if j.idle > 0 && j.idleFor(name, now) {
			continue
		}
		if requested || len(sv.b.AllServers()) > 0 {
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
	for _, m := range []map[string]time.Time{j.emptySince, j.lastRequested} {
		for name := range m {
			if j.services.Lookup(name) == nil {
				delete(m, name)
			}
		}
	}
}

// idleFor unfollows name, a live service no configuration names, when no
// request asked for it during the idle window (counted from the first
// sweep that saw it), and reports whether it did.
func (j *Janitor) idleFor(name string, now time.Time) bool {
	last, ok := j.lastRequested[name]
	if !ok {
		j.lastRequested[name] = now
		return false
	}
	if now.Sub(last) < j.idle {
		return false
	}
	// Unfollow checks again, under the table's lock: a request since
	// this sweep keeps it.
	if !j.services.Unfollow(name, func(sv *Service) bool {
		return !sv.requested.Load() && !j.services.watchers.watched(name)
	}) {
		return false
	}
	delete(j.lastRequested, name)
	delete(j.emptySince, name)
	j.log.Info().Str("service", name).Stringer("idle", j.idle).Msg("service unfollowed: no request for the idle window")
	return true
}
