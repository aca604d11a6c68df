package pushlb

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/subscriber"
)

// emptyGuard keeps a service's last list when the registry loses it all at
// once (Config.EmptyListHold): the bucket deleted, recreated empty, or
// purged. It looks at each list before it is applied. A list is held back
// when it is empty, the service had at least two servers before the run
// of removals that empties it (removals less than lossWindow apart: a
// purge key by key arrives as several lists, the first of which is
// applied), and every instance the run removed left because the registry
// no longer holds it (cause registry or resync): no offline announcement,
// no gossip death, no disconnect advisory, none of which a lost registry
// causes. The
// subscriber offers a held list again after its backoff
// (subscriber.ErrDeferred); it is applied once it names instances again
// (the registry is back: the publishers re-registered), once a removal has
// another cause, or once it has been held for the hold time.
//
// A service of one instance is not protected: its record's loss cannot be
// told from a lease that ended after a crash. Neither can the records of a
// whole service that crashed at once and whose leases ended together
// without gossip or advisories to tell: the hold time bounds that case.
type emptyGuard struct {
	hold  time.Duration // <= 0: off
	now   func() time.Time
	log   zerolog.Logger
	holds atomic.Uint64 // lists held back, each service counted once a hold

	mu   sync.Mutex
	held map[string]time.Time // service -> when its list was first held
	// losing is, per service, the start of its current run of registry
	// removals and the servers listed before it: removals one key at a
	// time (a purge key by key) arrive as several lists, and the one that
	// empties the service is judged on the size before the run.
	losing map[string]lossRun
}

// lossRun is a run of lists that only removed instances the registry lost.
type lossRun struct {
	since  time.Time
	before int
}

// lossWindow is how close together registry removals must come to be one
// loss: the registry losing everything at once, not leases ending one by
// one.
const lossWindow = time.Second

func newEmptyGuard(hold time.Duration, log zerolog.Logger) *emptyGuard {
	return &emptyGuard{hold: hold, now: time.Now, log: log, held: map[string]time.Time{}, losing: map[string]lossRun{}}
}

// check decides on lc, the next list of a service whose balancer lists
// listed servers now: nil to apply it, an error wrapping
// subscriber.ErrDeferred to keep the last list. held reports whether the
// registry's mirror holds an instance: a list whose every ID it lacks
// would be emptied all the same, by the lookups that build the servers
// (the rest of a purge, already applied to the mirror).
func (g *emptyGuard) check(lc events.ListChanged, listed int, held func(id string) bool) error {
	if g.hold <= 0 {
		return nil
	}
	lost := len(lc.InstanceIDs) < listed && registryLost(lc)
	empty := lost && !slices.ContainsFunc(lc.InstanceIDs, held)
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	run, inRun := g.losing[lc.Service]
	switch {
	case !lost:
		delete(g.losing, lc.Service)
		inRun = false
	case !inRun || now.Sub(run.since) > lossWindow:
		run, inRun = lossRun{since: now, before: listed}, true
		g.losing[lc.Service] = run
	}
	hold := lost && empty && run.before >= 2
	since, holding := g.held[lc.Service]
	switch {
	case hold && !holding:
		g.held[lc.Service] = g.now()
		g.holds.Add(1)
		g.log.Error().Str("service", lc.Service).Int("instances", run.before).Int("kept", listed).Dur("hold_at_most", g.hold).
			Msg("the registry lost every instance of the service at once (none announced offline, none found dead): last list kept")
		return fmt.Errorf("%w: %s: the registry lost its %d instances at once", subscriber.ErrDeferred, lc.Service, run.before)
	case hold && g.now().Sub(since) < g.hold:
		return fmt.Errorf("%w: %s: held since %s", subscriber.ErrDeferred, lc.Service, since.Format(time.RFC3339))
	case hold:
		delete(g.held, lc.Service)
		delete(g.losing, lc.Service)
		g.log.Error().Str("service", lc.Service).Dur("held", g.now().Sub(since)).
			Msg("the registry still holds no instance of the service after the hold: list emptied")
	case holding:
		delete(g.held, lc.Service)
		g.log.Warn().Str("service", lc.Service).Int("instances", len(lc.InstanceIDs)).Dur("held", g.now().Sub(since)).
			Msg("the registry holds the service's instances again: list no longer held")
	}
	return nil
}

// registryLost reports whether every instance lc removes left because the
// registry stopped holding it.
func registryLost(lc events.ListChanged) bool {
	if len(lc.Changes) == 0 {
		return lc.Cause == events.CauseRegistry || lc.Cause == events.CauseResync
	}
	for _, c := range lc.Changes {
		if c.Cause != events.CauseRegistry && c.Cause != events.CauseResync {
			return false
		}
	}
	return true
}

// isHeld reports whether the service's list is held now.
func (g *emptyGuard) isHeld(service string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.held[service]
	return ok
}
