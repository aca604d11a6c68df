package subscriber

// The services a subscriber follows. An unscoped subscriber follows every
// service: one subscription to every service's events, a mirror of every
// record. A scoped one (Config.Scoped, Config.Services) follows the
// services it is given: a subscription per service, a mirror watch per
// service (serverlist.MirrorConfig.Scoped), so that NATS sends it nothing
// of the others; Follow and Unfollow change the set while it runs.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
)

// scope is the set of followed services: nil for every service. It is
// read on every event, so it is an immutable map behind an atomic
// pointer, replaced (copied) when a service is followed or unfollowed,
// under the subscriber's dmu.
type scope struct {
	set atomic.Pointer[map[string]struct{}]
}

func (sc *scope) init(cfg Config) {
	if !cfg.Scoped {
		return
	}
	set := make(map[string]struct{}, len(cfg.Services))
	for _, svc := range cfg.Services {
		set[svc] = struct{}{}
	}
	sc.set.Store(&set)
}

// has reports whether service is followed.
func (sc *scope) has(service string) bool {
	set := sc.set.Load()
	if set == nil {
		return true
	}
	_, ok := (*set)[service]
	return ok
}

// scoped reports whether the set is not every service.
func (sc *scope) scoped() bool { return sc.set.Load() != nil }

// names returns the followed services, sorted; nil for every service.
func (sc *scope) names() []string {
	set := sc.set.Load()
	if set == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(*set))
}

// change replaces the set with one with service added (add) or removed.
// Called under the subscriber's dmu, on a scoped subscriber.
func (sc *scope) change(service string, add bool) {
	next := maps.Clone(*sc.set.Load())
	if add {
		next[service] = struct{}{}
	} else {
		delete(next, service)
	}
	sc.set.Store(&next)
}

// subscribe subscribes to the events of what is followed (every service,
// or each followed one) and to the advisories. Start calls it.
func (s *Subscriber) subscribe() error {
	var subs []*nats.Subscription
	svcSubs := make(map[string]*nats.Subscription)
	undo := func() {
		for _, sb := range subs {
			sb.Unsubscribe()
		}
		for _, sb := range svcSubs {
			sb.Unsubscribe()
		}
	}
	if !s.scope.scoped() {
		sub, err := s.subscribeEvents(events.WildcardSubject(s.cfg.Prefix))
		if err != nil {
			return err
		}
		subs = append(subs, sub)
	}
	for _, svc := range s.scope.names() {
		sub, err := s.subscribeEvents(events.ServiceSubject(s.cfg.Prefix, svc))
		if err != nil {
			undo()
			return err
		}
		svcSubs[svc] = sub
	}
	if s.cfg.AdvisorySubject != "" {
		sub, err := s.subscribeAdvisories()
		if err != nil {
			undo()
			return fmt.Errorf("subscriber: subscribe %s: %w", s.cfg.AdvisorySubject, err)
		}
		subs = append(subs, sub)
	}
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if s.stopped {
		undo()
		return ErrClosed
	}
	s.subs, s.svcSubs = subs, svcSubs
	return nil
}

// subscribeEvents subscribes onMsg to subject.
func (s *Subscriber) subscribeEvents(subject string) (*nats.Subscription, error) {
	sub, err := s.nc.Subscribe(subject, s.onMsg)
	if err != nil {
		return nil, fmt.Errorf("subscriber: subscribe %s: %w", subject, err)
	}
	// Never let a burst be dropped by the client as a slow consumer.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("subscriber: subscribe %s: %w", subject, err)
	}
	return sub, nil
}

// ErrNotScoped is returned by Follow and Unfollow on a subscriber that
// follows every service.
var ErrNotScoped = errors.New("subscriber: not scoped: every service is followed")

// Follow makes a scoped subscriber follow service: it subscribes to the
// service's events, has the mirror load the service's records and
// reconciles the service with them, so that its first list, delivered to
// the Handler soon after (not before Follow returns), holds the
// registry's full state, never a part of it. It returns whether the
// registry holds a routable instance of the service; for a service
// followed already, at once. Call it after Start.
//
// On an error (ctx ended before the records were loaded, the subscriber
// closed) the service stays followed, and its list comes once its records
// are loaded: call Unfollow to give it up. It returns ErrNotScoped on a
// subscriber that follows every service, and an error wrapping
// events.ErrInvalidService for an invalid name.
func (s *Subscriber) Follow(ctx context.Context, service string) (found bool, err error) {
	if !s.scope.scoped() {
		return false, ErrNotScoped
	}
	if err := events.ValidateService(service); err != nil {
		return false, fmt.Errorf("subscriber: follow: %w", err)
	}
	s.dmu.Lock()
	switch {
	case s.stopped:
		s.dmu.Unlock()
		return false, ErrClosed
	case !s.started:
		s.dmu.Unlock()
		return false, errors.New("subscriber: Follow before Start")
	}
	_, had := s.svcSubs[service]
	if !had {
		sub, err := s.subscribeEvents(events.ServiceSubject(s.cfg.Prefix, service))
		if err != nil {
			s.dmu.Unlock()
			return false, err
		}
		s.svcSubs[service] = sub
		s.scope.change(service, true)
	}
	s.dmu.Unlock()
	if !had {
		// The subscription is in place before the records are read: no
		// event falls between the two.
		if err := s.flush(ctx); err != nil {
			return false, fmt.Errorf("subscriber: follow %s: flush: %w", service, err)
		}
	}
	if err := s.mirror.Follow(ctx, service); err != nil {
		return false, fmt.Errorf("subscriber: follow %s: %w", service, err)
	}
	if !had {
		s.stats.follows.Add(1)
		s.reconcile(ctx, service, events.CauseResync)
		s.markDirty(service)
	}
	return len(s.mirror.Service(service)) > 0, nil
}

// Unfollow makes a scoped subscriber forget service: it unsubscribes from
// its events, the mirror forgets its records, the table its instances and
// the scheduler its deliveries. A delivery running meanwhile may still
// call the Handler, with an empty list. It reports whether the service
// was followed; it returns ErrNotScoped on a subscriber that follows every
// service.
func (s *Subscriber) Unfollow(service string) (bool, error) {
	if !s.scope.scoped() {
		return false, ErrNotScoped
	}
	s.dmu.Lock()
	sub, had := s.svcSubs[service]
	if had {
		delete(s.svcSubs, service)
		s.scope.change(service, false)
	}
	s.dmu.Unlock()
	if !had {
		return false, nil
	}
	var err error
	if uerr := sub.Unsubscribe(); uerr != nil && !errors.Is(uerr, nats.ErrConnectionClosed) && !errors.Is(uerr, nats.ErrBadSubscription) {
		err = fmt.Errorf("subscriber: unfollow %s: %w", service, uerr)
	}
	s.mirror.Unfollow(service)
	s.mu.Lock()
	s.table.dropService(service)
	delete(s.changes, service)
	delete(s.resynced, service)
	s.mu.Unlock()
	s.sched.forget(service)
	s.applied.Delete(service)
	s.stats.unfollows.Add(1)
	return true, err
}

// MayHold reports whether the registry may hold a record of service
// (serverlist.Registry.MayHold): a cheap check before Follow, bounded by
// the registry timeout.
func (s *Subscriber) MayHold(ctx context.Context, service string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RegistryTimeout)
	defer cancel()
	return s.reg.MayHold(ctx, service)
}

// Followed returns the services a scoped subscriber follows, sorted; nil
// for one that follows every service.
func (s *Subscriber) Followed() []string { return s.scope.names() }
