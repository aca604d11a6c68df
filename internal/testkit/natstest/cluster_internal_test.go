package natstest

import (
	"net"
	"testing"
	"time"
)

// A port taken between its choice and its node's start (by another test's
// server) does not fail StartCluster: it starts again on other ports, at
// once rather than after a node's readyTimeout.
func TestStartClusterRetriesOnATakenPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	calls := 0
	choosePorts = func(tb testing.TB, n int) ([]int, []int) {
		calls++
		routes, clients := clusterPorts(tb, n)
		if calls == 1 {
			clients[1] = held.Addr().(*net.TCPAddr).Port // n2's, taken
		}
		return routes, clients
	}
	defer func() { choosePorts = clusterPorts }()
	start := time.Now()
	c := StartCluster(t, 3)
	if calls != 2 || len(c.Nodes) != 3 {
		t.Fatalf("%d port choices, %d nodes; want 2 and 3", calls, len(c.Nodes))
	}
	if took := time.Since(start); took >= readyTimeout {
		t.Fatalf("the cluster started after %v: the taken port was found by the node's timeout", took)
	}
	nc := c.Connect(t)
	if !nc.IsConnected() {
		t.Fatal("not connected")
	}
}
