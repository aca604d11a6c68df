package natsproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// RegionsConfig adjusts StartRegionsWith. The zero value is
// StartRegions'.
type RegionsConfig struct {
	// PingInterval is every server's ping_interval, for its leaf links
	// and its clients alike; a link is given up after two unanswered
	// pings, 2 to 3 intervals after it died. Zero means 1 s.
	PingInterval time.Duration
	// Reconnect is the leaf nodes' reconnect interval: how long a leaf
	// node waits before it dials the hub again. Zero means 250 ms.
	Reconnect time.Duration
	// Extra is configuration text appended to every server's file:
	// accounts, say.
	Extra string
	// Account is the account the leaf nodes link (the remote's local
	// account; the hub binds a leaf node as it binds a client without
	// credentials, so give Extra a no_auth_user in it). Empty means the
	// global account.
	Account string
}

// Regions is one nats-server process per region, each with JetStream in a
// domain of its own named after the region: the first region is the hub,
// which listens for leaf nodes, and every other region is a leaf node of
// the hub through a natstest.Link of its own, so that Cut kills the link
// between two regions as a network does. The in-process counterpart,
// natstest.Regions, has the same topology.
//
// Its methods may be called from any goroutine; its processes are killed
// and its links closed at the test's cleanup.
type Regions struct {
	servers
	names []string
	links map[string]*natstest.Link // the leaf link of every region but the hub
}

// servers are the server processes of regions, by region name.
type servers struct {
	urls  map[string]string
	procs map[string]*testutil.Proc
}

func newServers() servers {
	return servers{urls: map[string]string{}, procs: map[string]*testutil.Proc{}}
}

// URL is the client URL of region name's server. It panics on a region
// the servers were not started for.
func (s *servers) URL(name string) string {
	u, ok := s.urls[name]
	if !ok {
		panic(fmt.Sprintf("natsproc: no region %q", name))
	}
	return u
}

// Proc is region name's server process.
func (s *servers) Proc(name string) *testutil.Proc {
	s.URL(name) // the check
	return s.procs[name]
}

// StartRegions starts a nats-server process of the binary bin per name,
// the first the hub, and returns once every two regions are linked
// (WaitLinked).
func StartRegions(tb testing.TB, bin string, names ...string) *Regions {
	tb.Helper()
	return StartRegionsWith(tb, bin, RegionsConfig{}, names...)
}

// StartRegionsWith is StartRegions with cfg.
func StartRegionsWith(tb testing.TB, bin string, cfg RegionsConfig, names ...string) *Regions {
	tb.Helper()
	if len(names) == 0 {
		tb.Fatalf("natsproc: no regions")
	}
	for i, name := range names {
		if name == "" || slices.Contains(names[:i], name) {
			tb.Fatalf("natsproc: region names %q: each must be given once and not be empty", names)
		}
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = time.Second
	}
	if cfg.Reconnect == 0 {
		cfg.Reconnect = 250 * time.Millisecond
	}
	hubLeaf := testutil.FreeAddr(tb)
	r := &Regions{servers: newServers(), names: names, links: map[string]*natstest.Link{}}
	for i, name := range names {
		client := testutil.FreeAddr(tb)
		var conf strings.Builder
		fmt.Fprintf(&conf, "server_name: %s\nlisten: %s\nping_interval: %q\nping_max: 2\n", name, client, cfg.PingInterval)
		fmt.Fprintf(&conf, "jetstream { store_dir: %q, domain: %s }\n", tb.TempDir(), name)
		if i == 0 {
			// Not advertised: a leaf node dials only its Link.
			fmt.Fprintf(&conf, "leafnodes { listen: %s, no_advertise: true }\n", hubLeaf)
		} else {
			link := natstest.NewLink(tb, hubLeaf)
			r.links[name] = link
			account := ""
			if cfg.Account != "" {
				account = fmt.Sprintf(", account: %q", cfg.Account)
			}
			fmt.Fprintf(&conf, "leafnodes { reconnect: %q, remotes: [ { url: %q, ignore_discovered_servers: true%s } ] }\n",
				cfg.Reconnect, link.URL(), account)
		}
		conf.WriteString(cfg.Extra)
		path := filepath.Join(tb.TempDir(), "nats.conf")
		if err := os.WriteFile(path, []byte(conf.String()), 0o600); err != nil {
			tb.Fatal(err)
		}
		r.procs[name] = testutil.StartCmd(tb, exec.Command(bin, "-c", path))
		r.urls[name] = "nats://" + client
	}
	for i, a := range names {
		for _, b := range names[i+1:] {
			r.WaitLinked(tb, a, b)
		}
	}
	return r
}

// Names returns the regions' names, the hub first.
func (r *Regions) Names() []string { return slices.Clone(r.names) }

// Connect returns a connection to region name's server that reconnects
// forever, closed at the test's cleanup; opts come after the defaults.
func (r *Regions) Connect(tb testing.TB, name string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	url := r.URL(name)
	var nc *nats.Conn
	testutil.EventuallyWithin(tb, time.Minute, "a connection to region "+name, func() bool {
		var err error
		nc, err = nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1)}, opts...)...)
		return err == nil
	})
	tb.Cleanup(nc.Close)
	return nc
}

// Cut cuts region name, a leaf node, off the hub (and so off every other
// region), both ways: its open leaf connection freezes, as over a dead
// link, until the servers' pings give it up, and its new ones hang.
// Clients still reach every region's server.
func (r *Regions) Cut(tb testing.TB, name string) {
	tb.Helper()
	r.link(tb, name).Pause()
}

// Heal restores region name's link to the hub and returns once the two
// are linked again (WaitLinked). A frozen leaf connection stays frozen
// until the pings give it up; the leaf node then dials again.
func (r *Regions) Heal(tb testing.TB, name string) {
	tb.Helper()
	r.link(tb, name).Resume()
	r.WaitLinked(tb, r.names[0], name)
}

func (r *Regions) link(tb testing.TB, name string) *natstest.Link {
	tb.Helper()
	l, ok := r.links[name]
	if !ok {
		tb.Fatalf("natsproc: region %q is not a leaf node of the hub", name)
	}
	return l
}

// WaitLinked waits until regions a and b are linked: a publish on either
// one's server reaches a subscriber on the other's, and the JetStream of
// each one's domain answers a client of the other. It fails the test
// after five minutes (a link cut with the server's default pings stays
// down for minutes).
func (r *Regions) WaitLinked(tb testing.TB, a, b string) {
	tb.Helper()
	natstest.WaitDomainsLinked(tb, 5*time.Minute,
		natstest.Domain{Name: a, URL: r.URL(a)}, natstest.Domain{Name: b, URL: r.URL(b)})
}
