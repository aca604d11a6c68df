package main

// A NATS node frozen whole (SIGSTOP), as a hung host is: nats-server
// processes, so that the node's routes freeze with its client connections
// and the cluster elects new leaders, which a frozen proxy in front of an
// in-process server (TestClusterNodePaused) does not show.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// registryStream is the registry bucket's stream under the default
// prefix.
const registryStream = "KV_pushlb_lb"

// TestClusterNodeStopped: three nats-server processes; the node that
// leads the registry stream also serves the gateway and one of three
// announcers (each given only its node's URL: they learn the others from
// the cluster). Under a steady load through the gateway that node is
// SIGSTOPped past the clients' ping interval, then resumed:
//
//   - the gateway and the announcer notice by their pings and connect to
//     another node, the announcer announces again there, and the cluster
//     elects another leader;
//   - no request fails and no live instance leaves the gateway's list
//     (it keeps its last list while it hears nothing);
//   - once the node is back, the registry and the gateway hold exactly
//     the live instances.
//
// The default lease (30 s, pings every 5 s): a node's raft election takes
// up to some 9 s on top of the pings, which a short lease would not leave
// room for. The times are logged, never asserted.
func TestClusterNodeStopped(t *testing.T) {
	c := natsproc.Start(t, bin.natsServer, 3)
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-nats", c.URLs[0], "-follow", "all")
	g.waitHealthy(t)
	// The test's own connection stays off the node it stops.
	nc, err := nats.Connect(c.URLs[1]+","+c.URLs[2], nats.DontRandomize(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, bucketTimeout, "the registry bucket at three replicas", func() bool { return bucketReplicated(js, 3) })
	leadStream(t, nc, js, c.Names[0])

	var anns []*testutil.Proc
	var live []string
	for i := range 3 {
		b := newTracked(t, fmt.Sprintf("i%d", i+1))
		anns = append(anns, announceOn(t, c.URLs[i], b))
		live = append(live, b.name)
	}
	testutil.Eventually(t, "three instances listed", func() bool { return slices.Equal(g.ids(t), live) })
	l := startLoad(g, loadWorkers)
	t.Cleanup(l.stop)
	l.waitMore(t, 100)
	updates := g.metric(`pushlb_list_updates_total{service="orders"}`)

	stopped := time.Now()
	c.Stop(t, 0)
	g.WaitFor(t, "reconnected to NATS", 2*time.Minute)
	gwMoved := time.Since(stopped)
	anns[0].WaitFor(t, "re-announced", 2*time.Minute)
	annMoved := time.Since(stopped)
	leader := streamLeader(t, js)
	c.Continue(t, 0)
	resumed := time.Now()

	kv, err := js.KeyValue(t.Context(), "pushlb_lb")
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, time.Minute, "the registry to hold every live instance", func() bool {
		return slices.Equal(registryIDsOrNil(kv), live)
	})
	testutil.Eventually(t, "the gateway to list every live instance", func() bool { return slices.Equal(g.ids(t), live) })
	right := time.Since(resumed)
	l.waitMore(t, 100)
	sent, failed := l.counts()
	changed := g.metric(`pushlb_list_updates_total{service="orders"}`) - updates
	t.Logf("node n0 stopped: the gateway moved after %v, the announcer re-announced after %v, the registry stream led by %s; "+
		"registry and list right %v after the node resumed; the list changed %v times; load: %d requests, %d failed, slowest %v",
		gwMoved.Round(time.Millisecond), annMoved.Round(time.Millisecond), leader, right.Round(time.Millisecond), changed,
		sent, failed, time.Duration(l.slowest.Load()))
	if failed != 0 {
		t.Errorf("%d of %d requests failed; first: %s", failed, sent, l.first())
	}
	if changed != 0 {
		t.Errorf("the list changed %v times, want 0: a live instance left it", changed)
	}
}

// leadStream makes the node named want lead the registry stream, by
// asking the leader to step down in its favour (nats-server 2.11's
// preferred placement) until it does.
func leadStream(t *testing.T, nc *nats.Conn, js jetstream.JetStream, want string) {
	t.Helper()
	req, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": want}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, time.Minute, "node "+want+" to lead the registry stream", func() bool {
		if streamLeader(t, js) == want {
			return true
		}
		// Its answer is read by the check above: a step-down that the
		// cluster refused (a replica not current yet) is asked again.
		_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+registryStream, req, 5*time.Second)
		return false
	})
}

// streamLeader returns the name of the node that leads the registry
// stream, "" while none does.
func streamLeader(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, registryStream)
	if err != nil {
		return ""
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}
