package natstest

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The timing of the links between regions. Every server pings its
// connections (the leaf links, and clients too) every regionPingInterval
// and gives a connection up when regionMaxPingsOut pings are unanswered:
// a cut link is noticed 1 to 1.5 s after it died. The leaf node then
// dials the hub again every regionReconnect and gives up a dial the hub
// does not answer (a cut link holds it) after regionFirstInfo.
const (
	regionPingInterval = 500 * time.Millisecond
	regionMaxPingsOut  = 2
	regionReconnect    = 250 * time.Millisecond
	regionFirstInfo    = 500 * time.Millisecond
)

// Regions is one in-process nats-server per region, each with JetStream in
// a domain of its own named after the region, as pushlb's multi-region
// deployments run them (docs/multiregion.md): the first region is the
// hub, which listens for leaf nodes, and every other region is a leaf node
// of the hub through a Link of its own, so that a test cuts a region off.
// A client reaches another region's JetStream through that region's domain
// (jetstream.NewWithDomain), across the leaf links; a leaf region reaches
// another leaf region through the hub.
//
// Its methods may be called from any goroutine.
type Regions struct {
	names   []string
	servers map[string]*Server
	links   map[string]*Link // the leaf link of every region but the hub
}

// StartRegions starts a server per name, the first the hub, and returns
// once every two regions are linked (WaitLinked). Everything stops at the
// test's cleanup.
func StartRegions(tb testing.TB, names ...string) *Regions {
	tb.Helper()
	return StartRegionsWith(tb, nil, names...)
}

// StartRegionsWith is StartRegions whose servers take opts, before the
// options of the regions (server name, JetStream domain, leaf nodes,
// pings), which they must not change. With accounts (WithAdvisories),
// the leaf nodes link the account that clients without credentials land
// in (no_auth_user); without, the global account.
func StartRegionsWith(tb testing.TB, opts []Option, names ...string) *Regions {
	tb.Helper()
	if len(names) == 0 {
		tb.Fatalf("natstest: no regions")
	}
	for i, name := range names {
		if name == "" || slices.Contains(names[:i], name) {
			tb.Fatalf("natstest: region names %q: each must be given once and not be empty", names)
		}
	}
	hubLeafPort := freeTCPPorts(tb, 1)[0]
	r := &Regions{names: names, servers: map[string]*Server{}, links: map[string]*Link{}}
	for i, name := range names {
		var link *Link
		if i > 0 {
			link = NewLink(tb, fmt.Sprintf("127.0.0.1:%d", hubLeafPort))
			r.links[name] = link
		}
		region := append(slices.Clone(opts), regionOption(name, hubLeafPort, link))
		s := &Server{opts: region, storeDir: tb.TempDir(), port: server.RANDOM_PORT}
		srv, err := s.start()
		if err != nil {
			tb.Fatalf("natstest: region %s: %v", name, err)
		}
		s.srv = srv
		tb.Cleanup(s.Shutdown)
		r.servers[name] = s
	}
	for i, a := range names {
		for _, b := range names[i+1:] {
			r.WaitLinked(tb, a, b)
		}
	}
	return r
}

// regionOption sets the options of region name: the hub (link nil)
// listens for leaf nodes on hubLeafPort, not advertised (a leaf node must dial
// only its Link); any other region is a leaf node of the hub through
// link, and ignores the leaf URLs the hub would tell it of.
func regionOption(name string, hubLeafPort int, link *Link) Option {
	return func(o *server.Options) {
		o.ServerName = name
		o.JetStreamDomain = name
		o.PingInterval, o.MaxPingsOut = regionPingInterval, regionMaxPingsOut
		if link == nil {
			o.LeafNode = server.LeafNodeOpts{Host: "127.0.0.1", Port: hubLeafPort, NoAdvertise: true}
			return
		}
		o.LeafNode = server.LeafNodeOpts{
			ReconnectInterval: regionReconnect,
			Remotes: []*server.RemoteLeafOpts{{
				URLs:                    []*url.URL{{Scheme: "nats-leaf", Host: link.Addr()}},
				LocalAccount:            noAuthAccount(o),
				IgnoreDiscoveredServers: true,
				FirstInfoTimeout:        regionFirstInfo,
			}},
		}
	}
}

// noAuthAccount is the account of o's no_auth_user, or "" (the global
// account) when there is none.
func noAuthAccount(o *server.Options) string {
	for _, u := range o.Users {
		if u.Username == o.NoAuthUser && u.Account != nil {
			return u.Account.Name
		}
	}
	return ""
}

// Names returns the regions' names, the hub first.
func (r *Regions) Names() []string { return slices.Clone(r.names) }

// Server returns region name's server. It panics on a name StartRegions
// was not given.
func (r *Regions) Server(name string) *Server {
	s, ok := r.servers[name]
	if !ok {
		panic(fmt.Sprintf("natstest: no region %q", name))
	}
	return s
}

// URL is the client URL of region name's server.
func (r *Regions) URL(name string) string { return r.Server(name).URL() }

// Connect connects a client to region name's server (Server.Connect).
func (r *Regions) Connect(tb testing.TB, name string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return r.Server(name).Connect(tb, opts...)
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
// until the pings give it up (1 to 1.5 s after the cut); the leaf node
// then dials again.
func (r *Regions) Heal(tb testing.TB, name string) {
	tb.Helper()
	r.link(tb, name).Resume()
	r.WaitLinked(tb, r.names[0], name)
}

func (r *Regions) link(tb testing.TB, name string) *Link {
	tb.Helper()
	l, ok := r.links[name]
	if !ok {
		tb.Fatalf("natstest: region %q is not a leaf node of the hub", name)
	}
	return l
}

// WaitLinked waits until regions a and b are linked (WaitDomainsLinked)
// and fails the test after readyTimeout.
func (r *Regions) WaitLinked(tb testing.TB, a, b string) {
	tb.Helper()
	WaitDomainsLinked(tb, readyTimeout, Domain{Name: a, URL: r.URL(a)}, Domain{Name: b, URL: r.URL(b)})
}

// Domain is a server with JetStream in domain Name, whose clients
// connect to URL.
type Domain struct {
	Name, URL string
}

// WaitDomainsLinked waits until the servers of domains a and b are
// linked: a publish on either one's reaches a subscriber on the other's,
// and the JetStream of each one's domain answers a client of the other.
// It fails the test after timeout. The servers may be processes.
func WaitDomainsLinked(tb testing.TB, timeout time.Duration, a, b Domain) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	pa := waitProbe(tb, deadline, a)
	defer pa.close()
	pb := waitProbe(tb, deadline, b)
	defer pb.close()
	for !pa.reaches(pb) || !pb.reaches(pa) || !pa.answers(b.Name) || !pb.answers(a.Name) {
		if time.Now().After(deadline) {
			tb.Fatalf("natstest: domains %s and %s not linked after %v", a.Name, b.Name, timeout)
		}
	}
}

// waitProbe returns a probe of d, connected as soon as d's server takes
// connections (a process may still be starting), and fails the test at
// deadline.
func waitProbe(tb testing.TB, deadline time.Time, d Domain) *probe {
	tb.Helper()
	for {
		p, err := newProbe(d.URL)
		if err == nil {
			return p
		}
		if time.Now().After(deadline) {
			tb.Fatalf("natstest: domain %s: %v", d.Name, err)
		}
		time.Sleep(20 * time.Millisecond) // the poll interval
	}
}

// probe is a connection to one region's server and a subscription of its
// own that another region's probe publishes to.
type probe struct {
	nc  *nats.Conn
	sub *nats.Subscription
	n   int // the count of its publishes, which tells its latest apart
}

func newProbe(url string) (*probe, error) {
	nc, err := nats.Connect(url, nats.Name("natstest-regions"), nats.Timeout(time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", url, err)
	}
	sub, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	return &probe{nc: nc, sub: sub}, nil
}

func (p *probe) close() { p.nc.Close() }

// reaches reports whether a publish of p's reaches other's subscriber
// within 100 ms (which also paces a waiting loop).
func (p *probe) reaches(other *probe) bool {
	p.n++
	want := fmt.Sprint(p.n)
	if err := p.nc.Publish(other.sub.Subject, []byte(want)); err != nil {
		return false
	}
	deadline := time.Now().Add(100 * time.Millisecond)
	for {
		m, err := other.sub.NextMsg(time.Until(deadline))
		if err != nil {
			return false
		}
		if string(m.Data) == want {
			return true
		}
	}
}

// answers reports whether the JetStream of domain answers p's client
// within a second.
func (p *probe) answers(domain string) bool {
	js, err := jetstream.NewWithDomain(p.nc, domain)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err == nil
}
