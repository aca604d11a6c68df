package subscriber_test

import (
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
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
