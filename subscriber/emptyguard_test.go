package subscriber_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// aliveMembers is what gossip says: these members alive.
type aliveMembers []gossip.Member

func (m aliveMembers) Members() []gossip.Member { return m }

// TestEmptyGuardReadsARecordThatCameAfterItsEvent: the one instance of a
// service is listed by its online event before the registry shows its
// record, so the guard cannot read the gossip node the record names; the
// record's arrival delivers the same list again, without a change for
// it. The guard reads the record then: when the registry later loses it
// while its node lives, the list is held.
func TestEmptyGuardReadsARecordThatCameAfterItsEvent(t *testing.T) {
	const id = "10.0.0.1:orders:8080"
	recs := fixedRecords{}
	node := gossip.Member{Name: "orders/a/7", Addr: "10.0.0.1:7946", Meta: gossip.Meta{Role: gossip.RoleInstance, Service: "orders", InstanceID: id}}
	g := subscriber.NewEmptyGuard(time.Minute, true, zerolog.Nop())
	g.Use(recs, aliveMembers{node})
	server := []*balancer.Server{{ID: id, Incarnation: 7}}

	online := events.ListChanged{Service: "orders", InstanceIDs: []string{id}, Changes: map[string]events.Change{id: {Cause: events.CauseAnnounce}}}
	if err := g.Admit(online, nil); err != nil {
		t.Fatal(err)
	}
	recs[id] = serverlist.Instance{Service: "orders", InstanceID: id, Incarnation: 7, GossipNode: node.Name, GossipAddr: node.Addr}
	if err := g.Admit(events.ListChanged{Service: "orders", InstanceIDs: []string{id}, Cause: events.CauseRegistry}, server); err != nil {
		t.Fatal(err)
	}

	delete(recs, id)
	lost := events.ListChanged{Service: "orders", Changes: map[string]events.Change{id: {Cause: events.CauseRegistry}}}
	if err := g.Admit(lost, server); !errors.Is(err, subscriber.ErrDeferred) {
		t.Fatalf("the registry lost the record of a live node: Admit = %v, want ErrDeferred", err)
	}
	if !g.Held("orders") {
		t.Fatal("the list is not held")
	}
}

// TestEmptyGuardRunOutlivesAListOfferedAgain: a service of two loses its
// records one after the other. The first loss reaches the guard as the
// lookups found it (the record went between the list and its lookups),
// then the same one-instance list is offered again; the second loss, in
// the same second, empties the service and is held: a list that changes
// nothing does not end the run, which is judged on the size before it.
func TestEmptyGuardRunOutlivesAListOfferedAgain(t *testing.T) {
	const a, b = "10.0.0.1:orders:8080", "10.0.0.2:orders:8080"
	recs := fixedRecords{
		a: {Service: "orders", InstanceID: a, Incarnation: 1},
		b: {Service: "orders", InstanceID: b, Incarnation: 1},
	}
	g := subscriber.NewEmptyGuard(time.Minute, false, zerolog.Nop())
	g.Use(recs, nil)
	both := []*balancer.Server{{ID: a, Incarnation: 1}, {ID: b, Incarnation: 1}}
	one := []*balancer.Server{{ID: b, Incarnation: 1}}
	registry := func(ids []string, gone ...string) events.ListChanged {
		lc := events.ListChanged{Service: "orders", InstanceIDs: ids, Cause: events.CauseRegistry}
		if len(gone) > 0 {
			lc.Changes = map[string]events.Change{}
			for _, id := range gone {
				lc.Changes[id] = events.Change{Cause: events.CauseRegistry}
			}
		}
		return lc
	}

	delete(recs, a)
	if err := g.Admit(registry([]string{b}, a), both); err != nil {
		t.Fatalf("the first loss: %v", err)
	}
	if err := g.Admit(registry([]string{b}), one); err != nil {
		t.Fatalf("the same list again: %v", err)
	}
	delete(recs, b)
	if err := g.Admit(registry(nil, b), one); !errors.Is(err, subscriber.ErrDeferred) {
		t.Fatalf("the second loss of the run: Admit = %v, want ErrDeferred (a service of two before the run)", err)
	}
}

// recordsResolver resolves IDs from fixedRecords, as the lookups read
// the mirror: an ID it lacks is not found.
type recordsResolver fixedRecords

func (r recordsResolver) ResolveEach(_ context.Context, service string, ids []string) ([]serverlist.Instance, []error) {
	found, errs := make([]serverlist.Instance, len(ids)), make([]error, len(ids))
	for i, id := range ids {
		in, ok := r[id]
		if !ok {
			errs[i] = fmt.Errorf("%w: %s/%s", serverlist.ErrNotFound, service, id)
		}
		found[i] = in
	}
	return found, errs
}

// TestEmptyGuardHoldsAListWhoseLookupsFindNone: the one instance of a
// service, whose gossip node lives, is offered again in a list that still
// names it (a list without causes, as a follow's resync sends), but its
// record went between the list and its lookups: the guard, which sees the
// list again as the lookups left it, holds it rather than let the Visitor
// empty the service.
func TestEmptyGuardHoldsAListWhoseLookupsFindNone(t *testing.T) {
	const id = "10.0.0.1:orders:8080"
	node := gossip.Member{Name: "orders/a/7", Addr: "10.0.0.1:7946", Meta: gossip.Meta{Role: gossip.RoleInstance, Service: "orders", InstanceID: id}}
	recs := fixedRecords{id: {Service: "orders", InstanceID: id, Host: "10.0.0.1", Port: 8080, Incarnation: 7, GossipNode: node.Name, GossipAddr: node.Addr}}
	g := subscriber.NewEmptyGuard(time.Minute, true, zerolog.Nop())
	g.Use(recs, aliveMembers{node})
	b, err := balancer.New("orders", balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	v := lbvisitor.NewVisitor(b, recordsResolver(recs), lbvisitor.VisitorConfig{Guard: g})
	if err := v.Apply(t.Context(), events.ListChanged{Service: "orders", InstanceIDs: []string{id}, Revision: 1, Cause: events.CauseResync}); err != nil {
		t.Fatal(err)
	}
	delete(recs, id)
	err = v.Apply(t.Context(), events.ListChanged{Service: "orders", InstanceIDs: []string{id}, Revision: 2})
	if !errors.Is(err, subscriber.ErrDeferred) || len(b.AllServers()) != 1 || !g.Held("orders") {
		t.Fatalf("Apply = %v with %d servers listed, held %v; want ErrDeferred, 1 and true", err, len(b.AllServers()), g.Held("orders"))
	}
}
