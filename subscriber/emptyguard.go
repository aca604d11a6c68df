package subscriber

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/serverlist"
)

// EmptyGuard keeps a service's last list when the registry loses it all at
// once (pushlb's Config.EmptyListHold): the bucket deleted, recreated
// empty, or purged. It is the balancers' guard (lbvisitor.Guard): it looks
// at each list before it is applied (Admit), and again as the lookups that
// build its servers left it when records went meanwhile. A list is held
// back when it is empty, every instance the run of removals that empties it
// removed left because the registry no longer holds it (cause registry or
// resync: no offline announcement, no gossip death, no disconnect
// advisory, none of which a lost registry causes), and one of these says
// the instances still run:
//
//   - gossip (the client is a member): the gossip node that a removed
//     instance's record named is alive (or suspect), for one instance or
//     more. A crashed instance's node is dead within the profile's
//     detection time, long before its lease ends, so a record that
//     vanishes while its node lives was lost, not expired;
//   - otherwise, the service had at least two servers before the run
//     (removals less than lossWindow apart: a purge key by key arrives as
//     several lists, the first of which are applied), and gossip knows none
//     of the removed instances' nodes dead.
//
// The subscriber offers a held list again after its backoff
// (ErrDeferred); it is applied once it names instances again
// (the registry is back: the publishers re-registered), once a removal has
// another cause, once gossip knows every held instance's node gone and
// none alive (a crash after the loss), or once it has been held for the
// hold time.
//
// Without gossip, a service of one instance is not protected: its record's
// loss cannot be told from a lease that ended after a crash. Neither can
// the records of a whole service that crashed at once and whose leases
// ended together without gossip or advisories to tell: the hold time
// bounds that case.
//
// Threading: Admit runs on the subscriber's delivery
// goroutines (one per service at a time, services concurrently), the
// GossipHandler on the gossip node's handler goroutine, Held on any
// goroutine; every method takes mu. Nothing is called back while mu is held: the mirror and the
// gossip node only answer queries, and the handler offers a list again
// after it let mu go.
type EmptyGuard struct {
	hold  time.Duration // <= 0: off
	now   func() time.Time
	log   zerolog.Logger
	holds atomic.Uint64 // lists held back, each service counted once a hold

	mu      sync.Mutex
	records records      // the registry's mirror; nil until the client starts
	gossip  memberLister // the client's gossip node; nil when off or not started
	held    map[string]holdState
	// losing is, per service, the start of its current run of registry
	// removals and the servers listed before it: removals one key at a
	// time (a purge key by key) arrive as several lists, and the one that
	// empties the service is judged on the size before the run.
	losing map[string]lossRun
	// nodes is, per service (with gossip configured), the gossip node that
	// each instance's record names, remembered from the mirror while the
	// record exists: once the registry lost it, this is how the guard
	// knows which node to ask about.
	nodes map[string]map[string]gossipNode
}

// records is what the guard reads of the registry's mirror
// (serverlist.Mirror).
type records interface {
	Get(service, id string) (serverlist.Instance, bool)
}

// memberLister is what the guard asks gossip (gossip.Node): the members
// alive or suspect now.
type memberLister interface {
	Members() []gossip.Member
}

// gossipNode is the gossip node an instance's record names, for the
// record's incarnation; name "" when it names none.
type gossipNode struct {
	incarnation int64
	name, addr  string
}

// holdState is a held list: since when, the service's size before the
// run that emptied it, and whether an instance of it was announced offline
// since (Offline).
type holdState struct {
	since     time.Time
	before    int
	announced bool
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

// NewEmptyGuard builds a guard that holds a list at most hold (<= 0: the
// guard is off and admits every list); withGossip says whether the client
// will run gossip, so that the guard remembers the records' gossip nodes
// from the first lists on, before the node starts.
func NewEmptyGuard(hold time.Duration, withGossip bool, log zerolog.Logger) *EmptyGuard {
	g := &EmptyGuard{hold: hold, now: time.Now, log: log, held: map[string]holdState{}, losing: map[string]lossRun{}}
	if withGossip {
		g.nodes = map[string]map[string]gossipNode{}
	}
	return g
}

// Use gives the guard the registry's mirror (Subscriber.Mirror) and, once
// started, the client's gossip node (nil: none).
func (g *EmptyGuard) Use(rs records, m memberLister) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.records, g.gossip = rs, m
}

// Admit decides on lc, the next list of a service whose balancer lists
// listed servers now (none when it has no balancer yet): nil to apply it,
// an error wrapping ErrDeferred to keep the last list. A list
// whose every ID the mirror lacks would be emptied all the same, by the
// lookups that build the servers (the rest of a purge, already applied to
// the mirror). A list whose records went between Admit and its lookups
// comes again as the lookups left it (lbvisitor.Guard).
func (g *EmptyGuard) Admit(lc events.ListChanged, listed []*balancer.Server) error {
	if g.hold <= 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	svc := lc.Service
	g.remember(lc)
	lost := len(lc.InstanceIDs) < len(listed) && registryLost(lc)
	empty := lost && !slices.ContainsFunc(lc.InstanceIDs, func(id string) bool { return g.registered(svc, id) })
	now := g.now()
	if h, holding := g.held[svc]; holding {
		return g.whileHeld(lc, listed, h, lost && empty && !h.announced, now)
	}
	run, inRun := g.losing[svc]
	switch {
	case !lost && inRun && !sameIDs(lc.InstanceIDs, listed):
		// A list that changes nothing (offered again) does not end a run.
		delete(g.losing, svc)
	case !lost:
	case !inRun || now.Sub(run.since) > lossWindow:
		run = lossRun{since: now, before: len(listed)}
		g.losing[svc] = run
	}
	if lost && empty {
		if w := g.witness(svc, listed); w.protects(run.before) {
			g.held[svc] = holdState{since: now, before: run.before}
			g.holds.Add(1)
			g.log.Error().Str("service", svc).Int("instances", run.before).Int("kept", len(listed)).
				Int("gossip_alive", w.alive).Dur("hold_at_most", g.hold).
				Msg("the registry lost every instance of the service at once (none announced offline, none found dead): last list kept")
			return fmt.Errorf("%w: %s: the registry lost its %d instances at once", ErrDeferred, svc, run.before)
		}
	}
	g.forget(lc)
	return nil
}

// Offline tells the guard that an instance of service was announced
// offline (an event). The gateway may apply the registry's removals before
// the offline events that preceded them (they come on other
// subscriptions): a mass offline whose removals came first is held, and
// its events, arriving next, end the hold at the list's next offer, as a
// removal with their cause would have.
func (g *EmptyGuard) Offline(service string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if h, ok := g.held[service]; ok && !h.announced {
		h.announced = true
		g.held[service] = h
	}
}

// whileHeld decides on the next list of a held service; stillLost says
// that it still empties the service for the registry's loss alone.
func (g *EmptyGuard) whileHeld(lc events.ListChanged, listed []*balancer.Server, h holdState, stillLost bool, now time.Time) error {
	svc := lc.Service
	level, why := zerolog.ErrorLevel, ""
	switch {
	case !stillLost:
		level, why = zerolog.WarnLevel, "the registry holds the service's instances again, or a change with another cause came"
	case now.Sub(h.since) >= g.hold:
		why = "the registry still holds no instance of the service after the hold: list emptied"
	case !g.witness(svc, listed).protects(h.before):
		why = "gossip found the held instances' nodes gone (a crash after the loss): list emptied"
	default:
		return fmt.Errorf("%w: %s: held since %s", ErrDeferred, svc, h.since.Format(time.RFC3339))
	}
	delete(g.held, svc)
	delete(g.losing, svc)
	g.forget(lc)
	g.log.WithLevel(level).Str("service", svc).Int("instances", len(lc.InstanceIDs)).Dur("held", now.Sub(h.since)).
		Str("why", why).Msg("list no longer held")
	return nil
}

// registered reports whether the registry's mirror holds service/id.
// Called with mu held.
func (g *EmptyGuard) registered(service, id string) bool {
	if g.records == nil {
		return false
	}
	_, ok := g.records.Get(service, id)
	return ok
}

// witness is what gossip says of the instances a list removes.
type witness struct {
	alive int // their record named a gossip node that is alive or suspect
	gone  int // their record named a gossip node that gossip does not know alive
}

// protects reports whether a list that empties a service of before
// servers (before its run of removals) is held: gossip vouches for one of
// its instances, or, with two or more, knows none of them gone.
func (w witness) protects(before int) bool {
	return w.alive > 0 || (w.gone == 0 && before >= 2)
}

// witness asks gossip about servers, the instances of service that a list
// removes, by the nodes their records named (remember). A server whose
// record named no node, or another incarnation, is neither alive nor
// gone: gossip knows nothing of it. Zero without gossip. Called with mu
// held.
func (g *EmptyGuard) witness(service string, servers []*balancer.Server) witness {
	known := g.nodes[service]
	if g.gossip == nil || len(known) == 0 {
		return witness{}
	}
	members := g.gossip.Members()
	alive := make(map[string]string, len(members)) // node name -> address
	for _, m := range members {
		if m.Meta.Role == gossip.RoleInstance {
			alive[m.Name] = m.Addr
		}
	}
	var w witness
	for _, s := range servers {
		n, ok := known[s.ID]
		addr, live := alive[n.name]
		switch {
		case !ok || n.name == "" || (s.Incarnation != 0 && s.Incarnation != n.incarnation):
		case live && addr == n.addr:
			w.alive++
		default:
			w.gone++
		}
	}
	return w
}

// remember records, with gossip configured, the gossip node that the
// records of lc's instances name: of every instance lc lists when the
// service has none remembered yet or lc is a resync, else of those lc
// changes (a restart under the same ID, a new incarnation, is a change)
// and of those whose record was not there yet, so that a list costs a
// read per changed instance. A node
// missed all the same (its record's incarnation no longer the server's)
// is not asked about (witness). Called with mu held.
func (g *EmptyGuard) remember(lc events.ListChanged) {
	if g.nodes == nil || g.records == nil {
		return
	}
	known := g.nodes[lc.Service]
	read := func(id string) {
		if in, ok := g.records.Get(lc.Service, id); ok {
			known[id] = gossipNode{incarnation: in.Incarnation, name: in.GossipNode, addr: in.GossipAddr}
		}
	}
	if known == nil || lc.Cause == events.CauseResync {
		if known == nil {
			known = make(map[string]gossipNode, len(lc.InstanceIDs))
			g.nodes[lc.Service] = known
		}
		for _, id := range lc.InstanceIDs {
			read(id)
		}
	}
	for id := range lc.Changes {
		read(id)
	}
	// An instance listed before the registry showed its record (its
	// online event came first) is read once the record is there: the
	// list the record's arrival redelivers has no change for it.
	for _, id := range lc.InstanceIDs {
		if _, ok := known[id]; !ok {
			read(id)
		}
	}
}

// forget drops, once lc is applied, the nodes of instances it no longer
// lists: all of them when it is empty, else once the stale ones would
// outnumber the listed ones (a pass over lc's IDs then, so that each
// removal costs O(1) amortised). Stale nodes until then are harmless:
// only listed instances are asked about. Called with mu held.
func (g *EmptyGuard) forget(lc events.ListChanged) {
	known := g.nodes[lc.Service]
	switch {
	case known == nil:
	case len(lc.InstanceIDs) == 0:
		delete(g.nodes, lc.Service)
	case len(known) > 2*len(lc.InstanceIDs)+16:
		listed := make(map[string]bool, len(lc.InstanceIDs))
		for _, id := range lc.InstanceIDs {
			listed[id] = true
		}
		for id := range known {
			if !listed[id] {
				delete(known, id)
			}
		}
	}
}

// GossipHandler wraps h, the subscriber's gossip handler: when the node
// that a held list's instance record named is gone, the list is offered
// again at once (reoffer) rather than after the subscriber's backoff (up
// to 5 s), so that a crash after the loss empties the list within
// gossip's detection time.
func (g *EmptyGuard) GossipHandler(h gossip.Handler, reoffer func(service string)) gossip.Handler {
	return gossip.HandlerFuncs{
		Alive: h.NodeAlive,
		Gone: func(m gossip.Member, reason gossip.Reason) {
			h.NodeGone(m, reason)
			if g.heldNode(m) {
				reoffer(m.Meta.Service)
			}
		},
	}
}

// heldNode reports whether m is the gossip node that the record of an
// instance of a held list named.
func (g *EmptyGuard) heldNode(m gossip.Member) bool {
	if m.Meta.Role != gossip.RoleInstance {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.held[m.Meta.Service]; !ok {
		return false
	}
	n, ok := g.nodes[m.Meta.Service][m.Meta.InstanceID]
	return ok && n.name == m.Name && n.addr == m.Addr
}

// sameIDs reports whether ids are the IDs of listed, in any order.
func sameIDs(ids []string, listed []*balancer.Server) bool {
	if len(ids) != len(listed) {
		return false
	}
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	for _, s := range listed {
		if !set[s.ID] {
			return false
		}
	}
	return true
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

// Held reports whether the service's list is held now.
func (g *EmptyGuard) Held(service string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.held[service]
	return ok
}

// Holds counts the lists held back, each service counted once a hold.
func (g *EmptyGuard) Holds() uint64 { return g.holds.Load() }
