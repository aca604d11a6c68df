// Package natsproc runs nats-server as real processes for tests and
// benchmarks: one server, or a cluster of routed nodes, each with
// JetStream in a store of its own and pushlb's accounts (disconnect
// advisories imported, internal/app/natsaccounts). What an in-process
// server cannot do needs them: a SIGSTOPped node (its routes freeze with
// it), a server's own CPU and RSS.
//
// The caller builds the binary once (testutil.BuildBinaries with
// [Module]) and passes its path. A Cluster's methods may be called from
// any goroutine; its processes are killed at the test's cleanup.
package natsproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/app/natsaccounts"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// Module is the import path testutil.BuildBinaries builds nats-server
// from: the version go.mod requires, the one the in-process tests run.
const Module = "github.com/nats-io/nats-server/v2"

// Cluster is n nats-server processes; a cluster of routed nodes when
// n > 1 (its name "pushlb-test").
type Cluster struct {
	// URLs are the nodes' client URLs, in node order.
	URLs []string
	// Procs are the nodes' processes, in node order.
	Procs []*testutil.Proc
	// Names are the nodes' server names (n0, n1, ...), as JetStream's
	// cluster information names a stream's leader.
	Names []string
}

// Start starts n nats-server processes of the binary bin and waits until
// JetStream answers (its meta leader elected, on a cluster).
func Start(tb testing.TB, bin string, n int) *Cluster {
	tb.Helper()
	accounts, err := natsaccounts.Config(events.DefaultPrefix)
	if err != nil {
		tb.Fatal(err)
	}
	clients, routes := make([]string, n), make([]string, n)
	for i := range n {
		clients[i], routes[i] = testutil.FreeAddr(tb), testutil.FreeAddr(tb)
	}
	c := &Cluster{}
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		var conf strings.Builder
		fmt.Fprintf(&conf, "server_name: %s\nlisten: %s\njetstream { store_dir: %q }\n", name, clients[i], tb.TempDir())
		if n > 1 {
			var others []string
			for j := range n {
				if j != i {
					others = append(others, "nats-route://"+routes[j])
				}
			}
			fmt.Fprintf(&conf, "cluster { name: pushlb-test, listen: %s, routes: [%s] }\n", routes[i], strings.Join(others, ", "))
		}
		conf.WriteString(accounts)
		path := filepath.Join(tb.TempDir(), "nats.conf")
		if err := os.WriteFile(path, []byte(conf.String()), 0o600); err != nil {
			tb.Fatal(err)
		}
		c.Procs = append(c.Procs, testutil.StartCmd(tb, exec.Command(bin, "-c", path)))
		c.URLs = append(c.URLs, "nats://"+clients[i])
		c.Names = append(c.Names, name)
	}
	js, err := jetstream.New(c.Connect(tb))
	if err != nil {
		tb.Fatal(err)
	}
	testutil.EventuallyWithin(tb, time.Minute, "JetStream to answer", func() bool {
		ctx, cancel := context.WithTimeout(tb.Context(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	})
	return c
}

// URL is every node's client URL, comma-separated.
func (c *Cluster) URL() string { return strings.Join(c.URLs, ",") }

// Connect returns a connection to the nodes that reconnects forever,
// closed at the test's cleanup.
func (c *Cluster) Connect(tb testing.TB) *nats.Conn {
	tb.Helper()
	var nc *nats.Conn
	testutil.EventuallyWithin(tb, time.Minute, "a connection to NATS", func() bool {
		var err error
		nc, err = nats.Connect(c.URL(), nats.MaxReconnects(-1))
		return err == nil
	})
	tb.Cleanup(nc.Close)
	return nc
}

// Node returns the index of the node named name, or -1.
func (c *Cluster) Node(name string) int {
	for i, n := range c.Names {
		if n == name {
			return i
		}
	}
	return -1
}

// Stop freezes node i (SIGSTOP): its client connections and its routes
// stay open and nothing on them is answered, as on a host that hangs.
// It returns once every thread of the process has stopped: kill(2) only
// queues the signal, and a thread running on another core goes on until
// it next enters the kernel.
func (c *Cluster) Stop(tb testing.TB, i int) {
	tb.Helper()
	c.signal(tb, i, syscall.SIGSTOP)
	testutil.Eventually(tb, "node "+c.Names[i]+" to stop", func() bool { return c.stopped(tb, i) })
}

// Continue resumes node i after Stop (SIGCONT), and returns once none of
// its threads is stopped.
func (c *Cluster) Continue(tb testing.TB, i int) {
	tb.Helper()
	c.signal(tb, i, syscall.SIGCONT)
	testutil.Eventually(tb, "node "+c.Names[i]+" to continue", func() bool { return !c.stopped(tb, i) })
}

func (c *Cluster) signal(tb testing.TB, i int, sig syscall.Signal) {
	tb.Helper()
	if err := syscall.Kill(c.Procs[i].Pid(), sig); err != nil {
		tb.Fatalf("node %s: %v: %v", c.Names[i], sig, err)
	}
}

// stopped reports whether every thread of node i is in the stopped state
// ('T' in /proc/<pid>/task/<tid>/stat).
func (c *Cluster) stopped(tb testing.TB, i int) bool {
	tb.Helper()
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", c.Procs[i].Pid()))
	if err != nil || len(stats) == 0 {
		tb.Fatalf("node %s: no thread states in /proc: %v", c.Names[i], err)
	}
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			return false // a thread that exited meanwhile: look again
		}
		// The state follows the command name, which is in parentheses
		// and may itself hold spaces or parentheses.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		if f := strings.Fields(rest); len(f) == 0 || f[0] != "T" {
			return false
		}
	}
	return true
}
