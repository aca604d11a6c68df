package lbvisitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// ErrKeptLastGood is wrapped by Apply's error when some IDs could not be
// resolved for a reason other than absence and kept their last known server.
var ErrKeptLastGood = errors.New("lbvisitor: lookups failed, last good servers kept")

// ErrRemoved is returned by Apply on a visitor its Registry removed; the
// list must go to the Registry again (which builds a new visitor).
var ErrRemoved = errors.New("lbvisitor: visitor removed")

// Resolver resolves instance IDs; *serverlist.Lookup is the implementation.
type Resolver interface {
	// ResolveEach returns, per ID, the instance (when errs[i] is nil) or an
	// error wrapping serverlist.ErrNotFound for an ID the registry does not
	// hold, or another error when the registry could not be asked.
	ResolveEach(ctx context.Context, service string, ids []string) (found []serverlist.Instance, errs []error)
}

// ServerResolver is a Resolver that gives balancer servers too:
// *serverlist.Lookup, whose servers for the instances its mirror holds are
// the mirror's own. A Visitor hands them to its balancer as they are
// (balancer.SetServersShared), so that a client holds one copy of each
// instance, not two.
type ServerResolver interface {
	Resolver
	// ResolveServers is ResolveEach with each instance as a server, which
	// nobody modifies.
	ResolveServers(ctx context.Context, service string, ids []string) (servers []*balancer.Server, errs []error)
}

// Guard has the last word on the lists a Visitor applies: it may keep the
// balancer's last list instead (subscriber.EmptyGuard keeps it when the
// registry loses every instance of a service at once). Its methods are
// called under the Visitor's lock, one list at a time per Visitor, Visitors
// concurrently; they must not call back into the Visitor.
type Guard interface {
	// Admit is called with every list before its lookups, with the servers
	// the balancer lists now. When the lookups then find fewer than listed
	// because records went meanwhile, it is called again with the list as
	// the lookups left it: the IDs found (none when every record went),
	// the missing ones as registry removals. So it sees the loss. An error
	// keeps the last list; Apply returns it.
	Admit(lc events.ListChanged, listed []*balancer.Server) error
}

// VisitorConfig is what a Visitor is built with; the zero value is a
// Visitor without guard, observer or logs.
type VisitorConfig struct {
	// Guard, when set, may keep the last list (see Guard).
	Guard Guard
	// OnChange, when set, is told of every change Apply makes to the list,
	// with the causes the ListChanged carries, under the Visitor's lock
	// (changes of one Visitor arrive one at a time, in order). It must be
	// quick and must not call Apply.
	OnChange func(ListChange)
	// Logger receives the Visitor's logs; the zero value logs nothing.
	Logger zerolog.Logger
}

// Stats are a Visitor's counters.
type Stats struct {
	// Applies counts ListChanged applied; Stale those dropped for an old
	// revision.
	Applies, Stale uint64
	// NotFound counts IDs left out because the registry does not hold them;
	// KeptLastGood those kept from the last list because their lookup failed.
	NotFound, KeptLastGood uint64
	// LastSize is the number of servers after the last apply.
	LastSize int
}

// Visitor applies ListChanged to one balancer.
type Visitor struct {
	b        *balancer.Balancer
	res      Resolver
	service  string
	guard    Guard
	onChange func(ListChange)
	log      zerolog.Logger

	mu      sync.Mutex // serialises Apply
	lastRev uint64
	removed bool // set by Registry.RemoveIf; Apply then refuses

	applies, stale, notFound, kept atomic.Uint64
	lastSize                       atomic.Int64
}

// NewVisitor wraps b, whose list it will own from now on: the balancer's
// polling updater is stopped. A Visitor owns no goroutine: there is nothing
// to start or close.
func NewVisitor(b *balancer.Balancer, res Resolver, cfg VisitorConfig) *Visitor {
	b.StopPolling()
	return &Visitor{b: b, res: res, service: b.Name(), guard: cfg.Guard, onChange: cfg.OnChange, log: cfg.Logger}
}

// Balancer returns the wrapped balancer.
func (v *Visitor) Balancer() *balancer.Balancer { return v.b }

// Stats returns the counters.
func (v *Visitor) Stats() Stats {
	return Stats{Applies: v.applies.Load(), Stale: v.stale.Load(), NotFound: v.notFound.Load(),
		KeptLastGood: v.kept.Load(), LastSize: int(v.lastSize.Load())}
}

// Apply rebuilds the balancer's list from lc. A ListChanged whose Revision
// is not above the last applied one is ignored (Revision 0 is always
// applied). See the package doc for lookups that fail.
func (v *Visitor) Apply(ctx context.Context, lc events.ListChanged) error {
	if lc.Service != v.service {
		return fmt.Errorf("lbvisitor: ListChanged for %q sent to the visitor of %q", lc.Service, v.service)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.removed {
		// Its Registry let it go (and its balancer may be closed): the
		// subscriber retries, and the next Handle builds a new visitor.
		return fmt.Errorf("%w: %s", ErrRemoved, v.service)
	}
	if lc.Revision != 0 && lc.Revision <= v.lastRev {
		v.stale.Add(1)
		return nil
	}
	listed := v.b.AllServers()
	if v.guard != nil {
		if err := v.guard.Admit(lc, listed); err != nil {
			return err
		}
	}
	servers, errs := v.resolve(ctx, lc.InstanceIDs)
	list := make([]*balancer.Server, 0, len(lc.InstanceIDs))
	var keptIDs, missing []string
	outage := 0
	for i, id := range lc.InstanceIDs {
		err := errs[i]
		switch {
		case err == nil:
			list = append(list, servers[i])
		case errors.Is(err, serverlist.ErrNotFound):
			// The registry is the truth: an ID it does not hold routes nothing.
			v.notFound.Add(1)
			missing = append(missing, id)
		default:
			// The registry could not be asked: keep what the balancer has.
			outage++
			if s := v.b.Server(id); s != nil {
				list = append(list, s) // listed: the balancer keeps it as it is
				keptIDs = append(keptIDs, id)
			}
		}
	}
	if len(list) == 0 && outage > 0 {
		// Nothing resolved and nothing to keep because of an outage: keep
		// the balancer's list rather than emptying it.
		return fmt.Errorf("%w: %s: %d of %d lookups failed, list unchanged", ErrKeptLastGood, v.service, outage, len(lc.InstanceIDs))
	}
	if len(missing) > 0 && len(list) < len(listed) && v.guard != nil {
		// Records went between the list and its lookups (all of them when
		// list is empty: an outage returned above).
		if err := v.guard.Admit(lostMeanwhile(lc, listed, list, missing), listed); err != nil {
			return err
		}
	}
	if err := v.b.SetServersShared(list); err != nil && !errors.Is(err, balancer.ErrClosed) {
		v.log.Warn().Err(err).Str("service", v.service).Msg("invalid servers from the registry left out")
	} else if errors.Is(err, balancer.ErrClosed) {
		return err
	}
	// The list changes only here while the Visitor owns the balancer, so
	// listed and now are this apply's before and after.
	now := v.b.AllServers()
	v.lastRev = lc.Revision
	v.applies.Add(1)
	v.lastSize.Store(int64(len(list)))
	v.log.Debug().Str("service", v.service).Int("before", len(listed)).Int("size", len(list)).Uint64("revision", lc.Revision).Msg("list applied")
	if v.onChange != nil && !slices.Equal(listed, now) {
		v.onChange(pushedChange(lc, listed, now))
	}
	if len(keptIDs) > 0 {
		v.kept.Add(uint64(len(keptIDs)))
		return fmt.Errorf("%w: %s: %v", ErrKeptLastGood, v.service, keptIDs)
	}
	return nil
}

// lostMeanwhile is lc as its lookups left it: the IDs of list, the
// servers of listed it no longer names removed, the missing ones by the
// registry and the others for the cause lc gave them.
func lostMeanwhile(lc events.ListChanged, listed, list []*balancer.Server, missing []string) events.ListChanged {
	out := lc
	out.InstanceIDs = make([]string, len(list))
	kept := make(map[string]bool, len(list))
	for i, s := range list {
		out.InstanceIDs[i] = s.ID
		kept[s.ID] = true
	}
	out.Changes = make(map[string]events.Change, len(listed))
	for _, s := range listed {
		if c, ok := lc.Changes[s.ID]; ok && !kept[s.ID] {
			out.Changes[s.ID] = c
		} else if !kept[s.ID] {
			out.Changes[s.ID] = events.Change{Cause: lc.Cause}
		}
	}
	for _, id := range missing {
		out.Changes[id] = events.Change{Cause: events.CauseRegistry}
	}
	return out
}

// resolve resolves ids as servers the balancer may keep as they are: a
// ServerResolver's, or servers of their own made from a Resolver's
// instances.
func (v *Visitor) resolve(ctx context.Context, ids []string) ([]*balancer.Server, []error) {
	if sr, ok := v.res.(ServerResolver); ok {
		return sr.ResolveServers(ctx, v.service, ids)
	}
	found, errs := v.res.ResolveEach(ctx, v.service, ids)
	servers := make([]*balancer.Server, len(ids))
	for i := range found {
		if errs[i] == nil {
			s := serverlist.ServerOf(found[i])
			servers[i] = &s
		}
	}
	return servers, errs
}
