package natstest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Partitions are the routes of a cluster started by
// StartPartitionableCluster: every route between two nodes goes through
// a Link of its own, so that a test cuts nodes from each other while
// their clients still reach them.
type Partitions struct {
	links [][]*Link // links[i][j]: node i's route to node j
}

// StartPartitionableCluster is StartCluster whose routes go through
// Links (Partitions): nodes route only through them (they advertise
// neither their routes nor their clients' URLs: clients are given every
// node's URL), and ping each other every 250 ms, so that a cut route is
// noticed within a second.
//
// A node tells the others of every node it routes to (route gossip), and
// one that hears of a node it has no route to yet connects to the address
// it heard, by default the node's own route port: a route past the Links,
// which no partition cuts (a node "isolated" so kept a route to one of the
// others, and the stream it led its quorum). It happens when a gossip
// arrives before the Link route a node retries every second, at the
// cluster's start or after a heal. So every node advertises, as its route
// address, a port that closes each connection at once (refuser): the
// connections gossip makes fail, and the nodes keep their Links' routes.
func StartPartitionableCluster(tb testing.TB, n int, opts ...Option) (*Cluster, *Partitions) {
	tb.Helper()
	// The refuser's port first: taken after the nodes' ports were chosen
	// (and let go, for the nodes to take), it could be one of them.
	nowhere := refuser(tb)
	routePorts, clientPorts := clusterPorts(tb, n)
	p := &Partitions{links: make([][]*Link, n)}
	for i := range n {
		p.links[i] = make([]*Link, n)
		for j := range n {
			if i != j {
				p.links[i][j] = NewLink(tb, fmt.Sprintf("127.0.0.1:%d", routePorts[j]))
			}
		}
	}
	c := startNodes(tb, routePorts, clientPorts, func(i int, o *server.Options) []*url.URL {
		o.Cluster.NoAdvertise, o.Cluster.PoolSize = true, -1
		o.Cluster.Advertise = nowhere
		o.PingInterval, o.MaxPingsOut = 250*time.Millisecond, 2
		var routes []*url.URL
		for j, l := range p.links[i] {
			if j != i {
				routes = append(routes, &url.URL{Scheme: "nats-route", Host: l.Addr()})
			}
		}
		return routes
	}, opts)
	return c, p
}

// Isolate cuts node i (0-based) from every other node, both ways: its
// routes freeze and new ones hang, while its clients still reach it.
func (p *Partitions) Isolate(i int) {
	for j := range p.links {
		if j != i {
			p.links[i][j].Pause()
			p.links[j][i].Pause()
		}
	}
}

// Heal lets node i's routes be made again (the frozen ones stay frozen
// until the nodes' pings give them up).
func (p *Partitions) Heal(i int) {
	for j := range p.links {
		if j != i {
			p.links[i][j].Resume()
			p.links[j][i].Resume()
		}
	}
}

// refuser listens on a free port of 127.0.0.1 and closes every connection
// it accepts at once; it returns its address. The test's cleanup stops it.
func refuser(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("natstest: refuser: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed
			}
			c.Close()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		<-done
	})
	return ln.Addr().String()
}
