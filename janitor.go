package pushlb

import (
	"sync"
	"time"

	"github.com/pushlb/pushlb/lbvisitor"
)

// janitor removes the balancers of services gone from the registry: a
// service that no configuration names, whose list has been empty for a
// whole grace period and that no request asked for meanwhile. Without it, a
// stream of announcements for invented or retired services would grow the
// client (balancers, their stats, metric series) without bound.
type janitor struct {
	c        *Client
	visitors *lbvisitor.Registry
	grace    time.Duration
	every    time.Duration
	keep     map[string]bool // configured services: never removed

	emptySince map[string]time.Time // the janitor goroutine's own

	stop chan struct{}
	wg   sync.WaitGroup
}

func newJanitor(c *Client, visitors *lbvisitor.Registry) *janitor {
	keep := map[string]bool{}
	for _, name := range c.opts.Balancers.Names() {
		keep[name] = true
	}
	return &janitor{
		c: c, visitors: visitors, grace: c.opts.ServiceGrace, keep: keep,
		every:      min(max(c.opts.ServiceGrace/4, 10*time.Millisecond), 30*time.Second),
		emptySince: map[string]time.Time{}, stop: make(chan struct{}),
	}
}

func (j *janitor) start() {
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

func (j *janitor) close() {
	close(j.stop)
	j.wg.Wait()
}

// sweep looks at every service once.
func (j *janitor) sweep(now time.Time) {
	for name, sv := range j.c.services.all() {
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
		// Under the visitor registry's lock, so that no list is being
		// applied and no visitor (or balancer) can be built meanwhile.
		removed := j.visitors.RemoveIf(name, func(v *lbvisitor.Visitor) bool {
			if len(v.Balancer().AllServers()) > 0 {
				return false
			}
			j.c.services.remove(name)
			j.c.factory.Remove(name)
			return true
		})
		if removed {
			j.c.removed.Add(1)
			j.c.opts.log.Info().Str("service", name).Stringer("grace", j.grace).Msg("service removed: no instance and no request for the grace period")
		}
	}
	for name := range j.emptySince {
		if j.c.services.lookup(name) == nil {
			delete(j.emptySince, name)
		}
	}
}
