package serverlist

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestStopWatcherDoesNotWaitForTheConsumersDeletion: a watch is stopped
// through a node cut from its cluster, where the deletion of the watch's
// consumer gets no answer (nats.go waits its request timeout, 5 s). The
// stop returns once the watch's channel is closed, the deletion still
// running; it is counted, and ends.
func TestStopWatcherDoesNotWaitForTheConsumersDeletion(t *testing.T) {
	c, p := natstest.StartPartitionableCluster(t, 3)
	c.WaitJetStream(t)
	// Cut a node that does not lead the meta group: the API requests it
	// forwards then go unanswered.
	cut := slices.IndexFunc(c.Nodes, func(n *natstest.Server) bool { return !n.NATS().JetStreamIsLeader() })
	js, err := jetstream.New(c.Nodes[cut].Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	var kv jetstream.KeyValue
	testutil.EventuallyWithin(t, time.Minute, "a bucket of 3 replicas", func() bool {
		kv, err = js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "stop", Replicas: 3})
		return err == nil
	})
	w, err := kv.WatchAll(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if e := <-w.Updates(); e != nil {
		t.Fatalf("an empty bucket's watch gave %v before its catch-up marker", e)
	}
	p.Isolate(cut)
	defer p.Heal(cut)

	var stopping sync.WaitGroup
	deleted := stopWatcherAsync(w, &stopping)
	select {
	case <-deleted:
		t.Fatal("the stop returned only once the consumer's deletion had ended")
	default:
	}
	stopping.Wait() // counted, and it ends (the client's request timeout)
	<-deleted
}
