package subscriber_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// fixedRecords is a registry mirror of one service's instances, for the
// guard's benchmark.
type fixedRecords map[string]serverlist.Instance

func (r fixedRecords) Get(_, id string) (serverlist.Instance, bool) {
	in, ok := r[id]
	return in, ok
}

type noMembers struct{}

func (noMembers) Members() []gossip.Member { return nil }

// BenchmarkEmptyGuardCheck: the guard's cost per list of a service of
// 10,000 instances whose list changes in one instance (the common case,
// nothing lost), without gossip and with it (the changed instance's
// record read again).
func BenchmarkEmptyGuardCheck(b *testing.B) {
	const n = 10_000
	recs := fixedRecords{}
	ids := make([]string, 0, n)
	listed := make([]*balancer.Server, 0, n)
	for i := range n {
		id := fmt.Sprintf("10.0.%d.%d:orders:8080", i/250, i%250)
		recs[id] = serverlist.Instance{Service: "orders", InstanceID: id, Incarnation: 7,
			GossipNode: "orders/" + id + "/7", GossipAddr: fmt.Sprintf("10.0.%d.%d:7946", i/250, i%250)}
		ids = append(ids, id)
		listed = append(listed, &balancer.Server{ID: id, Incarnation: 7})
	}
	lc := events.ListChanged{Service: "orders", InstanceIDs: ids, Changes: map[string]events.Change{ids[0]: {Cause: events.CauseAnnounce}}}
	for _, withGossip := range []bool{false, true} {
		b.Run(fmt.Sprintf("gossip=%v", withGossip), func(b *testing.B) {
			g := subscriber.NewEmptyGuard(2*time.Minute, withGossip, zerolog.Nop())
			g.Use(recs, noMembers{})
			if err := g.Admit(lc, listed); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := g.Admit(lc, listed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
