package natstest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// clusterName names every test cluster; clusters of different tests never
// meet, since their route ports differ.
const clusterName = "natstest"

// Cluster is n in-process nats-servers with JetStream, routed to each other
// as one cluster, each with its own store directory, as a production
// three-node deployment runs them. A node can be shut down (a crash) and
// restarted on the same ports with its store.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n nodes on 127.0.0.1, waits until JetStream has a
// meta leader (the cluster can create streams), and registers their
// shutdown with tb.Cleanup. opts apply to every node.
//
// The nodes' ports are chosen before the nodes start (each node lists the
// others' route ports), reserved against other tests (freeTCPPorts); a
// process outside the tests may still take one in between, and that node
// cannot listen: the cluster then starts again on other ports, up to
// clusterAttempts times.
func StartCluster(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("natstest: cluster of %d nodes", n)
	}
	for attempt := 1; ; attempt++ {
		routePorts, clientPorts := choosePorts(tb, n)
		routes := make([]*url.URL, n)
		for i := range n {
			routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", routePorts[i])}
		}
		c, err := tryNodes(tb, routePorts, clientPorts, func(int, *server.Options) []*url.URL { return routes }, opts)
		if err == nil {
			c.WaitJetStream(tb)
			return c
		}
		if attempt == clusterAttempts {
			tb.Fatalf("%v (%d attempts, each on other ports)", err, attempt)
		}
		tb.Logf("%v; the cluster starts again on other ports", err)
	}
}

// clusterAttempts bounds StartCluster's starts.
const clusterAttempts = 3

// choosePorts is clusterPorts; tests of StartCluster replace it.
var choosePorts = clusterPorts

// portsFree reports an error when a port was taken since it was chosen:
// a node given it would not listen, which it would only tell by not
// becoming ready within readyTimeout.
func portsFree(ports ...int) error {
	for _, p := range ports {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return fmt.Errorf("port %d taken since it was chosen: %w", p, err)
		}
		ln.Close()
	}
	return nil
}

// clusterPorts returns the route and the client ports of n nodes. They are
// chosen together, all held open at once, so that they differ: a node's
// client port left to the system could be the route port chosen for a
// node started after it (a node failed to start so in CI's benchmark
// pass).
func clusterPorts(tb testing.TB, n int) (routePorts, clientPorts []int) {
	all := freeTCPPorts(tb, 2*n)
	return all[:n], all[n:]
}

// startNodes starts a node per route port, named n1, n2, ..., each
// listening for clients on its client port and routed to routes(i, o),
// which may also set more of node i's options; then opts. It waits until
// JetStream has a meta leader.
func startNodes(tb testing.TB, routePorts, clientPorts []int, routes func(i int, o *server.Options) []*url.URL, opts []Option) *Cluster {
	tb.Helper()
	c, err := tryNodes(tb, routePorts, clientPorts, routes, opts)
	if err != nil {
		tb.Fatal(err)
	}
	c.WaitJetStream(tb)
	return c
}

// tryNodes is startNodes without the wait for a meta leader: a node that
// does not start shuts down those started before it and is the error.
func tryNodes(tb testing.TB, routePorts, clientPorts []int, routes func(i int, o *server.Options) []*url.URL, opts []Option) (*Cluster, error) {
	tb.Helper()
	c := &Cluster{}
	for i := range routePorts {
		name := fmt.Sprintf("n%d", i+1)
		node := append([]Option{func(o *server.Options) {
			o.ServerName = name
			o.Cluster = server.ClusterOpts{Name: clusterName, Host: "127.0.0.1", Port: routePorts[i]}
			o.Routes = routes(i, o)
		}}, opts...)
		s := &Server{opts: node, storeDir: tb.TempDir(), port: clientPorts[i]}
		// A node's readiness for clients does not wait for its routes, so
		// the nodes can start one after the other.
		err := portsFree(clientPorts[i], routePorts[i])
		var srv *server.Server
		if err == nil {
			srv, err = s.start()
		}
		if err != nil {
			for _, started := range c.Nodes {
				started.Shutdown()
			}
			return nil, fmt.Errorf("natstest: cluster node %s (client port %d, route port %d): %w", name, clientPorts[i], routePorts[i], err)
		}
		s.srv = srv
		tb.Cleanup(s.Shutdown)
		c.Nodes = append(c.Nodes, s)
	}
	return c, nil
}

// freeTCPPorts returns n distinct ports on 127.0.0.1 for the nodes to
// take (route ports must be known before the nodes start, so that each
// node can list the others): testutil.FreePort's, below the kernel's
// ephemeral range and reserved for the test's life, so that no other
// test's port-0 socket or FreePort takes one before its node binds it. A
// port 0 bound and closed here raced exactly so.
func freeTCPPorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, n)
	for i := range ports {
		ports[i] = testutil.FreePort(tb)
	}
	return ports
}

// URL returns the client URLs of every node, comma-separated, as a client
// with failover takes them.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = s.URL()
	}
	return strings.Join(urls, ",")
}

// Connect connects a client to every node's URL (it picks one and fails
// over to the others) and closes it in tb.Cleanup.
func (c *Cluster) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, c.URL(), opts)
}

// WaitJetStream waits until the running nodes have a JetStream meta leader
// that counts every running node as an online peer (it has their
// statistics), so that streams can be created and placed on all of them
// (an R3 stream right after start could fail with "no suitable peers for
// placement, peer offline"), and fails the test after readyTimeout.
func (c *Cluster) WaitJetStream(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		running := 0
		var leader *server.Server
		for _, s := range c.Nodes {
			if srv := s.NATS(); srv != nil && srv.Running() {
				running++
				if srv.JetStreamIsLeader() {
					leader = srv
				}
			}
		}
		if leader != nil && len(leader.JetStreamClusterPeers()) >= running && c.jetStreamAnswers() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("natstest: the cluster's JetStream has no meta leader with every running node online after %v", readyTimeout)
}

// jetStreamAnswers reports whether a client gets the account's JetStream
// information, the first thing every JetStream client asks.
func (c *Cluster) jetStreamAnswers() bool {
	nc, err := nats.Connect(c.URL(), nats.Timeout(time.Second))
	if err != nil {
		return false
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err == nil
}

// StreamLeader returns the node that leads stream (in the default
// account), or nil when none does, e.g. during an election.
func (c *Cluster) StreamLeader(stream string) *Server {
	for _, s := range c.Nodes {
		if srv := s.NATS(); srv != nil && srv.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return s
		}
	}
	return nil
}

// CopyStores stops every node, copies each one's store, and starts them
// again: the copies are the cluster's state as of now, which
// RestartWithStores brings back (a coordinated power loss before the
// latest writes reached any node's disk).
func (c *Cluster) CopyStores(tb testing.TB) []string {
	tb.Helper()
	for _, s := range c.Nodes {
		s.Shutdown()
	}
	dirs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		dirs[i] = s.copyStore(tb)
	}
	c.restartAll(tb)
	return dirs
}

// RestartWithStores stops every node and starts each one over a copy of
// its store in dirs (CopyStores'): every stream comes back as it was then,
// its later writes lost on every node.
func (c *Cluster) RestartWithStores(tb testing.TB, dirs []string) {
	tb.Helper()
	for _, s := range c.Nodes {
		s.Shutdown()
	}
	for i, s := range c.Nodes {
		s.useStoreCopy(tb, dirs[i])
	}
	c.restartAll(tb)
}

// restartAll starts every node again and waits for JetStream.
func (c *Cluster) restartAll(tb testing.TB) {
	tb.Helper()
	for _, s := range c.Nodes {
		s.Restart(tb)
	}
	c.WaitJetStream(tb)
}

// MoveStreamLeader makes node lead stream (in the default account): it
// asks the current leader to step down in node's favour (a preferred
// placement, nats-server 2.11+) until node leads, and fails the test
// after readyTimeout. A node that leads already is left as it is.
func (c *Cluster) MoveStreamLeader(tb testing.TB, stream string, node *Server) {
	tb.Helper()
	name := node.NATS().Name()
	req := fmt.Appendf(nil, `{"placement":{"preferred":%q}}`, name)
	nc := c.Connect(tb)
	defer nc.Close()
	deadline := time.Now().Add(readyTimeout)
	for c.StreamLeader(stream) != node {
		if time.Now().After(deadline) {
			tb.Fatalf("natstest: %s does not lead stream %s after %v", name, stream, readyTimeout)
		}
		// The answer comes once the old leader stepped down; the new one
		// may take a moment more to be known.
		if _, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 2*time.Second); err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for wait := time.Now().Add(2 * time.Second); c.StreamLeader(stream) == nil && time.Now().Before(wait); {
			time.Sleep(10 * time.Millisecond)
		}
	}
}
