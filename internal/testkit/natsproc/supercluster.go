package natsproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// StartExample starts nats-server (the binary bin) with the configuration
// file path, whose fixed addresses and store directories are replaced as
// subs says (from, to, from, to, ...): each must be in the file, or the
// test fails, so that a changed example is noticed. The client address
// 0.0.0.0:4222 is replaced by a free one. It returns the client URL once
// the server takes connections, and the process, killed at the test's
// cleanup.
func StartExample(tb testing.TB, bin, path string, subs ...string) (string, *testutil.Proc) {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	name := filepath.Base(path)
	client := testutil.FreeAddr(tb)
	subs = append(subs, "0.0.0.0:4222", client)
	conf := string(b)
	for i := 0; i < len(subs); i += 2 {
		if !strings.Contains(conf, subs[i]) {
			tb.Fatalf("natsproc: %s no longer holds %q", name, subs[i])
		}
		conf = strings.ReplaceAll(conf, subs[i], subs[i+1])
	}
	rewritten := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(rewritten, []byte(conf), 0o600); err != nil {
		tb.Fatal(err)
	}
	proc := testutil.StartCmd(tb, exec.Command(bin, "-c", rewritten))
	testutil.EventuallyWithin(tb, time.Minute, name+"'s server to take connections", func() bool {
		select {
		case <-proc.Done():
			tb.Fatalf("natsproc: nats-server -c %s exited:\n%s", name, proc.Output())
		default:
		}
		nc, err := nats.Connect("nats://"+client, nats.Timeout(time.Second))
		if err != nil {
			return false
		}
		nc.Close()
		return true
	})
	return "nats://" + client, proc
}

// SuperclusterRegions are the regions of the example supercluster, in the
// order of its files: gateway-eu.conf, gateway-us.conf.
var SuperclusterRegions = []string{"eu", "us"}

// Supercluster is the example supercluster of docs/multiregion.md
// (examples/nats-server/multiregion/gateway-eu.conf and gateway-us.conf)
// run as two nats-server processes, clusters eu and us of one server
// each, joined by NATS gateways: one JetStream domain, one meta group of
// both servers. Each server's gateway connection to the other goes
// through a natstest.Link, so that Cut kills the link between the
// regions as a network does.
//
// Its methods may be called from any goroutine; its processes are killed
// and its links closed at the test's cleanup.
type Supercluster struct {
	servers
	links map[string]*natstest.Link // in front of each region's gateway listener
}

// StartSupercluster starts the example supercluster from the directory
// dir (examples/nats-server/multiregion of the module) with the binary
// bin: the files' addresses are replaced by free ones of 127.0.0.1 and
// their store directories by temporary ones. It returns once a publish in
// either region reaches a subscriber in the other (WaitLinked); the
// JetStream meta group may still be electing its leader then.
func StartSupercluster(tb testing.TB, bin, dir string) *Supercluster {
	tb.Helper()
	sc := &Supercluster{servers: newServers(), links: map[string]*natstest.Link{}}
	gateways := map[string]string{}
	for _, region := range SuperclusterRegions {
		gateways[region] = testutil.FreeAddr(tb)
		sc.links[region] = natstest.NewLink(tb, gateways[region])
	}
	for _, region := range SuperclusterRegions {
		route := testutil.FreeAddr(tb)
		subs := []string{
			"0.0.0.0:6222", route,
			region + "-1.example.net:6222", route,
			// Advertised through the link: a server passes on the
			// gateway URLs it learns (the INFO's), and one that reached
			// the other region directly would bypass Cut.
			"listen: 0.0.0.0:7222", fmt.Sprintf("listen: %s\n  advertise: %s", gateways[region], sc.links[region].Addr()),
			"/var/lib/nats/" + region, tb.TempDir(),
		}
		for _, other := range SuperclusterRegions {
			subs = append(subs, other+".example.net:7222", sc.links[other].Addr())
		}
		sc.urls[region], sc.procs[region] = StartExample(tb, bin, filepath.Join(dir, "gateway-"+region+".conf"), subs...)
	}
	sc.WaitLinked(tb, time.Minute)
	return sc
}

// Cut cuts the gateway link between the regions, both ways: the open
// gateway connections freeze, as over a dead link, until the servers'
// pings give them up (the files' ping_interval 2 s and ping_max 2: 4 to
// 6 s), and new ones hang. Clients still reach both servers.
func (sc *Supercluster) Cut() {
	for _, l := range sc.links {
		l.Pause()
	}
}

// Heal lets new gateway connections through again and returns once the
// regions are linked (WaitLinked, bounded by timeout). The connections
// frozen by Cut stay frozen until the pings give them up; the servers
// then dial again.
func (sc *Supercluster) Heal(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	for _, l := range sc.links {
		l.Resume()
	}
	sc.WaitLinked(tb, timeout)
}

// WaitLinked waits until a publish in either region reaches a subscriber
// in the other, and fails the test after timeout.
func (sc *Supercluster) WaitLinked(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	conns := map[string]*nats.Conn{}
	subs := map[string]*nats.Subscription{}
	for _, region := range SuperclusterRegions {
		nc, err := nats.Connect(sc.URL(region), nats.Timeout(time.Second))
		if err != nil {
			tb.Fatalf("natsproc: connect to %s: %v", region, err)
		}
		defer nc.Close()
		sub, err := nc.SubscribeSync(nats.NewInbox())
		if err != nil {
			tb.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			tb.Fatal(err)
		}
		conns[region], subs[region] = nc, sub
	}
	// reaches reports whether a publish of from's reaches to's
	// subscriber within 100 ms (which also paces the loop). Only the
	// latest publish counts: an earlier one may arrive late.
	n := 0
	reaches := func(from, to string) bool {
		n++
		want := fmt.Sprint(n)
		if conns[from].Publish(subs[to].Subject, []byte(want)) != nil || conns[from].Flush() != nil {
			return false
		}
		deadline := time.Now().Add(100 * time.Millisecond)
		for {
			m, err := subs[to].NextMsg(time.Until(deadline))
			if err != nil {
				return false
			}
			if string(m.Data) == want {
				return true
			}
		}
	}
	deadline := time.Now().Add(timeout)
	for !reaches("eu", "us") || !reaches("us", "eu") {
		if time.Now().After(deadline) {
			tb.Fatalf("natsproc: the supercluster's regions not linked after %v", timeout)
		}
	}
}
