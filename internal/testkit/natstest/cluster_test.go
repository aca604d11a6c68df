package natstest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// A replicated bucket survives the loss of its stream leader: writes go on
// through the other nodes, and the node comes back with its store.
func TestClusterSurvivesLeaderLoss(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	var leader *natstest.Server
	deadline := time.Now().Add(10 * time.Second)
	for leader == nil && time.Now().Before(deadline) {
		leader = c.StreamLeader("KV_b")
	}
	if leader == nil {
		t.Fatal("no stream leader")
	}
	leader.Shutdown()
	var put error
	for time.Now().Before(deadline.Add(10 * time.Second)) {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, put = kv.Put(actx, "k", []byte("2"))
		acancel()
		if put == nil {
			break
		}
	}
	if put != nil {
		t.Fatalf("put after the leader's loss: %v", put)
	}
	leader.Restart(t)
	c.WaitJetStream(t)
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "2" {
		t.Fatalf("get after the restart: %v %v", e, err)
	}
}

// A partitionable cluster forms through its links; a node cut from the
// others loses its routes, and has them again once healed, as many times
// as it is cut: no route goes past the links (a route that route gossip
// made to a node's own port, after a heal or at the start, left the node
// "isolated" with a route to one of the others).
func TestPartitionableCluster(t *testing.T) {
	c, p := natstest.StartPartitionableCluster(t, 3)
	routes := func(i int) int {
		if srv := c.Nodes[i].NATS(); srv != nil {
			return srv.NumRoutes()
		}
		return -1
	}
	for round := range 3 {
		i := round % 2 // node 1, node 2, node 1 again
		p.Isolate(i)
		testutil.Eventually(t, fmt.Sprintf("round %d: node %d without routes", round+1, i+1), func() bool { return routes(i) == 0 })
		p.Heal(i)
		testutil.Eventually(t, fmt.Sprintf("round %d: node %d routed to both others again", round+1, i+1), func() bool { return routes(i) == 2 })
	}
	c.WaitJetStream(t)
}
