package pushlb_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// announce announces a backend as an instance of service through its own
// connection, as cmd/announce does.
func announce(t *testing.T, srv *natstest.Server, service, zone string, b *httptest.Server) *publisher.Publisher {
	t.Helper()
	return testpub.Announce(t, srv.Connect(t), service, zone, b)
}

// start builds and starts a client with the zero Config.
func start(t *testing.T, nc *nats.Conn, opts ...pushlb.Option) *pushlb.Client {
	t.Helper()
	return startWith(t, nc, pushlb.Config{}, opts...)
}

// startWith builds and starts a client with cfg; cleanup closes it.
func startWith(t testing.TB, nc *nats.Conn, cfg pushlb.Config, opts ...pushlb.Option) *pushlb.Client {
	t.Helper()
	c, err := pushlb.New(nc, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get returns the body of a GET through client.
func get(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The zero configuration: New, Start, and an http.Client calls a service by
// name, balanced over its announced instances; a withdrawn instance gets
// nothing from the next request on.
func TestZeroConfigTransport(t *testing.T) {
	srv := natstest.Start(t)
	a := announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	c := start(t, srv.Connect(t))
	client := &http.Client{Transport: c.Transport()}

	// Registered before Start: routable as soon as Start returns.
	if got := get(t, client, "http://orders/api/x"); got != "a /api/x" {
		t.Fatalf("first request: %q", got)
	}
	announce(t, srv, "orders", "", testpub.Backend(t, "b"))
	seen := map[string]bool{}
	testutil.Eventually(t, "both instances to answer", func() bool {
		seen[get(t, client, "http://orders/x")] = true
		return seen["a /x"] && seen["b /x"]
	})
	if err := a.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a to leave", func() bool {
		b, _ := c.Balancer("orders")
		return len(b.Servers()) == 1
	})
	for range 20 {
		if got := get(t, client, "http://orders/y"); got != "b /y" {
			t.Fatalf("request reached %q after a withdrew", got)
		}
	}

	_, err := client.Get("http://nobody/x")
	if !errors.Is(err, pushlb.ErrUnknownService) {
		t.Fatalf("unknown service: %v", err)
	}
	if _, err := c.Balancer("nobody"); !errors.Is(err, pushlb.ErrUnknownService) || !strings.HasPrefix(err.Error(), `pushlb: no balancer for "nobody"`) {
		t.Fatalf("Balancer(nobody): %v (want errors.Is ErrUnknownService, said by this package)", err)
	}
	if !errors.Is(err, lbhttp.ErrUnknownService) {
		t.Fatalf("a Transport's error for an unknown service does not match lbhttp's kind: %v", err)
	}
	if names := c.Services(); len(names) != 1 || names[0] != "orders" {
		t.Fatalf("services %v: a made-up name must not build a balancer", names)
	}
	st := c.Stats()
	if !st.Started || len(st.Services) != 1 || st.Services[0].Servers != 1 || st.Services[0].Updates < 3 || st.Events.Received < 2 || st.Lookups.Hits == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestHandlerAndRoutes(t *testing.T) {
	srv := natstest.Start(t)
	announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	c := start(t, srv.Connect(t), pushlb.WithProxyOptions(lbhttp.WithRoutes(lbhttp.Route{Prefix: "/shop/", Service: "orders", StripPrefix: true})))
	front := httptest.NewServer(c.Handler())
	t.Cleanup(front.Close)
	for path, want := range map[string]string{"/orders/x": "a /x", "/shop/y": "a /y"} {
		if got := get(t, http.DefaultClient, front.URL+path); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
	resp, err := http.Get(front.URL + "/nobody/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown service: %d, want 404", resp.StatusCode)
	}
}

// The Config sets the balancers' configuration and zone, and limits the
// services followed.
func TestConfigShapesTheBalancers(t *testing.T) {
	srv := natstest.Start(t)
	cfg := balancer.DefaultClientsConfig()
	orders := cfg.Defaults
	orders.Rule = balancer.RuleRoundRobin
	orders.ListOfServers = []string{"127.0.0.1:1"}
	cfg.Clients = map[string]balancer.Config{"static": orders}
	// Registered before Start: a followed service would have its list (and
	// its balancer) when Start returns, which waits for the first list of
	// every live service it follows.
	announce(t, srv, "other", "z1", testpub.Backend(t, "o"))
	var mu sync.Mutex
	var lags []time.Duration
	c := startWith(t, srv.Connect(t), pushlb.Config{Balancers: cfg, Zone: "z1", Services: []string{"orders", "static"}, AntiEntropy: time.Hour},
		pushlb.WithEventHook(func(e events.Event) { mu.Lock(); lags = append(lags, time.Since(e.At)); mu.Unlock() }))
	if _, err := c.Balancer("other"); !errors.Is(err, pushlb.ErrUnknownService) {
		t.Fatalf("other, not followed, has a balancer: %v", err)
	}

	// A configured service has its balancer from the start.
	b, err := c.Balancer("static")
	if err != nil {
		t.Fatal(err)
	}
	if b.Config().Rule != balancer.RuleRoundRobin || b.Config().Zone != "z1" || c.Zone() != "z1" {
		t.Fatalf("static: %+v, client's zone %q", b.Config(), c.Zone())
	}
	announce(t, srv, "orders", "z1", testpub.Backend(t, "a"))
	testutil.Eventually(t, "orders to be routed", func() bool {
		b, err := c.Balancer("orders")
		return err == nil && len(b.Servers()) == 1
	})
	ob, _ := c.Balancer("orders")
	if ob.Config().Zone != "z1" || ob.Config().Rule != balancer.RuleZoneAvoidance {
		t.Fatalf("orders: %+v", ob.Config())
	}
	// The hook sees the online event (which may come after the registry
	// record made the list).
	testutil.Eventually(t, "the event hook to see the online event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lags) > 0
	})
}

// Every bad field of the Config and every bad option is reported in one
// error wrapping ErrInvalidOption, each named.
func TestInvalidConfigReportedTogether(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	bad := balancer.DefaultClientsConfig()
	bad.Defaults.Rule = "Fastest"
	_, err := pushlb.New(nc, pushlb.Config{
		Prefix: "a b", Lease: time.Millisecond, Services: []string{"bad.name"}, AntiEntropy: -1, Coalesce: -1,
		ServiceGrace: -time.Second, RegistryReplicas: 9, Balancers: bad, Gossip: &gossip.Config{Profile: "slow"},
		Limits: pushlb.Limits{Services: -1, ConfirmWithin: -1},
	}, pushlb.WithListObserver(nil), nil, pushlb.WithTransportOptions(lbhttp.WithRetryOnStatus(700)))
	if !errors.Is(err, pushlb.ErrInvalidOption) {
		t.Fatalf("want ErrInvalidOption, got %v", err)
	}
	// Validate says the same of the Config, without a connection.
	verr := pushlb.Config{
		Prefix: "a b", Lease: time.Millisecond, Services: []string{"bad.name"}, AntiEntropy: -1, Coalesce: -1,
		ServiceGrace: -time.Second, RegistryReplicas: 9, Balancers: bad, Gossip: &gossip.Config{Profile: "slow"},
		Limits: pushlb.Limits{Services: -1, ConfirmWithin: -1},
	}.Validate()
	if !errors.Is(verr, pushlb.ErrInvalidOption) || !strings.Contains(verr.Error(), "Config.Limits.ConfirmWithin") || !strings.Contains(verr.Error(), "Config.Prefix") {
		t.Fatalf("Validate: %v", verr)
	}
	for _, want := range []string{"Config.Prefix", "Config.Lease", "Config.Services", "Config.AntiEntropy", "Config.Coalesce",
		"Config.ServiceGrace", "Config.RegistryReplicas", "Config.Balancers: defaults: balancer", "Config.Gossip",
		"Config.Limits.Services", "Config.Limits.ConfirmWithin", "WithListObserver", "option 1 is nil"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := pushlb.New(nil, pushlb.Config{}); !errors.Is(err, pushlb.ErrInvalidOption) {
		t.Fatalf("nil conn: %v", err)
	}
	if _, err := pushlb.New(nc, pushlb.Config{}, pushlb.WithTransportOptions(lbhttp.WithRetryOnStatus(700))); !errors.Is(err, pushlb.ErrInvalidOption) || !strings.Contains(err.Error(), "WithTransportOptions") {
		t.Fatalf("transport option: %v", err)
	}
}

// The zero Config is DefaultConfig: New fills in the same defaults.
func TestZeroConfigIsDefaultConfig(t *testing.T) {
	srv := natstest.Start(t)
	for _, cfg := range []pushlb.Config{{}, pushlb.DefaultConfig()} {
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Validate(%+v): %v", cfg, err)
		}
		if _, err := pushlb.New(srv.Connect(t), cfg); err != nil {
			t.Fatalf("New(%+v): %v", cfg, err)
		}
	}
}

func TestLifecycle(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)

	// Close without Start, then Start: closed.
	c, err := pushlb.New(nc, pushlb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); !errors.Is(err, pushlb.ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}

	// Start twice, Close twice; the connection stays the caller's.
	c = start(t, nc)
	if err := c.Start(t.Context()); !errors.Is(err, pushlb.ErrStarted) {
		t.Fatalf("second Start: %v", err)
	}
	c.Close()
	c.Close()
	if nc.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}
	if c.Stats().Started {
		t.Fatal("closed client reports started")
	}

	// A Start that cannot finish (no JetStream) fails with its step named
	// and leaves the client closed.
	plain := natstest.Start(t, natstest.WithoutJetStream())
	c, err = pushlb.New(plain.Connect(t), pushlb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := c.Start(ctx); !errors.Is(err, serverlist.ErrNoJetStream) || !strings.Contains(err.Error(), "pushlb: registry") ||
		!strings.Contains(err.Error(), "-js") {
		t.Fatalf("Start without JetStream: %v, want the step and how to turn JetStream on", err)
	}
	if err := c.Start(ctx); !errors.Is(err, pushlb.ErrClosed) {
		t.Fatalf("Start after a failed Start: %v", err)
	}
}

// Picks keep working after Close, from the last lists.
func TestTransportAfterClose(t *testing.T) {
	srv := natstest.Start(t)
	announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	c := start(t, srv.Connect(t))
	client := &http.Client{Transport: c.Transport()}
	get(t, client, "http://orders/y") // followed on this request
	c.Close()
	if got := get(t, client, "http://orders/z"); got != "a /z" {
		t.Fatalf("after Close: %q", got)
	}
	c.Transport().CloseIdleConnections()
}

// A service whose instances are all gone, that no configuration names and
// that no request asks for, is removed after the grace period; a new
// announcement builds it again.
func TestGoneServicesAreRemoved(t *testing.T) {
	srv := natstest.Start(t)
	cfg := balancer.DefaultClientsConfig()
	cfg.Clients = map[string]balancer.Config{"static": cfg.Defaults}
	// Every service: the services built by announcements.
	c := startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowAll, ServiceGrace: 100 * time.Millisecond, Balancers: cfg})
	client := &http.Client{Transport: c.Transport()}
	orders := announce(t, srv, "orders", "", testpub.Backend(t, "o"))
	busy := announce(t, srv, "busy", "", testpub.Backend(t, "b"))
	testutil.Eventually(t, "both services routed", func() bool {
		st := c.Stats()
		return len(st.Services) == 3 && st.Services[0].Servers == 1 && st.Services[1].Servers == 1
	})
	// busy keeps being asked for, with no instance left: it stays.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if resp, err := client.Get("http://busy/x"); err == nil {
				resp.Body.Close()
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	orders.Withdraw(t.Context(), "test")
	busy.Withdraw(t.Context(), "test")
	testutil.Eventually(t, "orders to be removed", func() bool { return c.Stats().ServicesRemoved == 1 })
	if got := c.Services(); !slices.Equal(got, []string{"busy", "static"}) {
		t.Fatalf("services after the grace period: %v, want busy (requested) and static (configured)", got)
	}
	if _, err := client.Get("http://orders/x"); !errors.Is(err, pushlb.ErrUnknownService) {
		t.Fatalf("a removed service: %v", err)
	}
	announce(t, srv, "orders", "", testpub.Backend(t, "o2"))
	testutil.Eventually(t, "orders back", func() bool {
		resp, err := client.Get("http://orders/x")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// WithListObserver sees every list change, in order per service, with who
// joined and left and why. An announcement's record and event race to the
// gateway, as a withdrawal's event and removal do: either may cause the
// change, and the test accepts both.
func TestListObserver(t *testing.T) {
	srv := natstest.Start(t)
	changes := make(chan pushlb.ListChange, 16)
	cfg := balancer.DefaultClientsConfig()
	static := cfg.Defaults
	static.ListOfServers = []string{"127.0.0.1:1"}
	cfg.Clients = map[string]balancer.Config{"static": static}
	startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowAll, Balancers: cfg}, pushlb.WithListObserver(func(lc pushlb.ListChange) { changes <- lc }))
	next := func(what string) pushlb.ListChange {
		t.Helper()
		return testutil.Receive(t, changes, 10*time.Second, "a list change for "+what)
	}
	if lc := next("the static list"); lc.Service != "static" || len(lc.Joined) != 1 || lc.Joined[0].Cause != events.CauseConfig {
		t.Fatalf("static list: %+v", lc)
	}
	a := announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	lc := next("the announcement")
	if lc.Service != "orders" || len(lc.Joined) != 1 || len(lc.Left) != 0 || len(lc.Servers) != 1 {
		t.Fatalf("announcement: %+v", lc)
	}
	switch j := lc.Joined[0]; j.Cause {
	case events.CauseAnnounce:
		if j.EventAt.IsZero() || j.EventAt.After(lc.At) {
			t.Errorf("an announcement's change has event time %v (applied at %v)", j.EventAt, lc.At)
		}
	case events.CauseRegistry: // the record came first
	default:
		t.Errorf("announcement caused by %q, want announce or registry", j.Cause)
	}
	if err := a.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	lc = next("the withdrawal")
	if lc.Service != "orders" || len(lc.Left) != 1 || len(lc.Joined) != 0 || len(lc.Servers) != 0 {
		t.Fatalf("withdrawal: %+v", lc)
	}
	if c := lc.Left[0].Cause; c != events.CauseOffline && c != events.CauseRegistry {
		t.Errorf("withdrawal caused by %q, want offline or registry", c)
	}
	if _, err := pushlb.New(srv.Connect(t), pushlb.Config{}, pushlb.WithListObserver(nil)); !errors.Is(err, pushlb.ErrInvalidOption) {
		t.Fatalf("nil observer: %v", err)
	}
}

// The bucket holds the lease: a client that sets none takes the bucket's;
// one whose lease disagrees with an existing bucket's fails to start,
// saying so, instead of running with a lease it did not ask for.
func TestLeaseDisagreementFailsStart(t *testing.T) {
	srv := natstest.Start(t)
	// The first client creates the bucket with a 10 s lease.
	startWith(t, srv.Connect(t), pushlb.Config{Lease: 10 * time.Second})
	startWith(t, srv.Connect(t), pushlb.Config{}) // takes the bucket's
	c, err := pushlb.New(srv.Connect(t), pushlb.Config{Lease: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(t.Context())
	if !errors.Is(err, serverlist.ErrLeaseMismatch) || !strings.Contains(err.Error(), "20s") || !strings.Contains(err.Error(), "10s") {
		t.Fatalf("Start with a lease the bucket disagrees with: %v, want ErrLeaseMismatch naming both", err)
	}
}

// BenchmarkCloseWithGossipPeer: Close of a started client whose gossip
// node has a peer, nothing in flight. (A graceful gossip leave waited for
// its broadcast's retransmissions: about 1 s.)
func BenchmarkCloseWithGossipPeer(b *testing.B) {
	srv := natstest.Start(b)
	// The fast profile, so that the peer's probes of the closed clients end
	// soon after the benchmark (the leak check waits for them).
	peer, err := gossip.New(gossip.Config{BindAddr: "127.0.0.1:0", Profile: gossip.ProfileFast, Meta: gossip.Meta{Role: gossip.RoleGateway}}, gossip.HandlerFuncs{})
	if err != nil {
		b.Fatal(err)
	}
	if err := peer.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	defer peer.Close()
	for b.Loop() {
		b.StopTimer()
		c, err := pushlb.New(srv.Connect(b), pushlb.Config{Gossip: &gossip.Config{BindAddr: "127.0.0.1:0", Profile: gossip.ProfileFast, Join: []string{peer.LocalAddr()}}})
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Start(b.Context()); err != nil {
			b.Fatal(err)
		}
		testutil.Eventually(b, "the peer", func() bool { return c.Stats().Gossip.Members == 2 })
		b.StartTimer()
		c.Close()
	}
}

// Watch gives the current list at once (empty for a service nobody
// announced yet), then the list after each change, and nothing after stop.
func TestWatch(t *testing.T) {
	srv := natstest.Start(t)
	c := start(t, srv.Connect(t))
	lists := make(chan []string, 16)
	stop := c.Watch("orders", func(servers []*balancer.Server) {
		ids := []string{}
		for _, s := range servers {
			ids = append(ids, s.ID)
		}
		slices.Sort(ids)
		lists <- ids
	})
	next := func(what string) []string {
		t.Helper()
		return testutil.Receive(t, lists, 10*time.Second, what)
	}
	if l := next("the current list"); len(l) != 0 {
		t.Fatalf("first call %v, want the empty list of an unknown service", l)
	}
	a, b := testpub.Backend(t, "a"), testpub.Backend(t, "b")
	pa := announce(t, srv, "orders", "", a)
	announce(t, srv, "orders", "", b)
	want := []string{a.URL, b.URL}
	slices.Sort(want)
	for l := next("both instances"); !slices.Equal(l, want); l = next("both instances") {
	}
	if err := pa.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	for l := next("a's withdrawal"); !slices.Equal(l, []string{b.URL}); l = next("a's withdrawal") {
	}
	stop()
	// This goroutine made no call since: none was in progress, and a
	// stopped watch begins none (deliver checks the flag stop sets first).
	for len(lists) > 0 {
		<-lists
	}
	stop() // twice is harmless
	announce(t, srv, "orders", "", testpub.Backend(t, "c"))
	testutil.Eventually(t, "c listed", func() bool { b, _ := c.Balancer("orders"); return len(b.Servers()) == 2 })
	if len(lists) != 0 {
		t.Fatalf("a stopped watch was called: %v", <-lists)
	}
}

// WatchServices gives the names at once (the configured ones before any
// announcement), then the names after each service added or removed, and
// nothing after stop.
func TestWatchServices(t *testing.T) {
	srv := natstest.Start(t)
	cfg := balancer.DefaultClientsConfig()
	cfg.Clients = map[string]balancer.Config{"static": cfg.Defaults}
	c := startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowAll, ServiceGrace: 100 * time.Millisecond, Balancers: cfg})
	names := make(chan []string, 16)
	stop := c.WatchServices(func(services []string) { names <- services })
	next := func(what string, want ...string) {
		t.Helper()
		for {
			got := testutil.Receive(t, names, 10*time.Second, what)
			if slices.Equal(got, want) {
				return
			}
		}
	}
	next("the configured service", "static")
	orders := announce(t, srv, "orders", "", testpub.Backend(t, "o"))
	next("orders added", "orders", "static")
	announce(t, srv, "users", "", testpub.Backend(t, "u"))
	next("users added", "orders", "static", "users")
	if err := orders.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	next("orders removed after the grace period", "static", "users")
	stop()
	for len(names) > 0 {
		<-names
	}
	stop() // twice is harmless
	announce(t, srv, "billing", "", testpub.Backend(t, "b"))
	testutil.Eventually(t, "billing added", func() bool { return slices.Contains(c.Services(), "billing") })
	if len(names) != 0 {
		t.Fatalf("a stopped watch was called: %v", <-names)
	}
}

// A tripped server is not reachable: ServiceStats.Reachable and
// Balancer.Reachable leave it out while its breaker is open, Servers
// still lists it.
func TestTrippedServerIsNotReachable(t *testing.T) {
	srv := natstest.Start(t)
	cfg := balancer.DefaultClientsConfig()
	cfg.Defaults.Breaker.Factor, cfg.Defaults.Breaker.Max = time.Hour, time.Hour // no probe during the test
	c := startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowAll, Balancers: cfg})
	dead := testutil.FreeAddr(t) // nothing listens: connections are refused
	nc := srv.Connect(t)
	testpub.AnnounceAddr(t, nc, "orders", "", "dead", dead)
	announce(t, srv, "orders", "", testpub.Backend(t, "live"))
	testutil.Eventually(t, "both listed", func() bool { b, err := c.Balancer("orders"); return err == nil && len(b.Servers()) == 2 })
	client := &http.Client{Transport: c.Transport()}
	b, _ := c.Balancer("orders")
	testutil.Eventually(t, "the dead server's breaker to trip", func() bool {
		get(t, client, "http://orders/x") // retried on the live one
		return b.Server("dead").Stats().CircuitTripped()
	})
	if r := b.Reachable(); len(r) != 1 || r[0].ID == "dead" {
		t.Fatalf("Reachable %v, want the live server only", r)
	}
	if ss, _ := c.ServiceStats("orders"); ss.Servers != 2 || ss.Reachable != 1 {
		t.Fatalf("ServiceStats %+v, want 2 servers, 1 reachable", ss)
	}
}

// A gossip node that cannot start fails Start with an error that names
// gossip once ("pushlb: gossip: ...", not "pushlb: gossip: gossip: ...").
func TestGossipStartErrorSaysGossipOnce(t *testing.T) {
	srv := natstest.Start(t)
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := pushlb.New(srv.Connect(t), pushlb.Config{Gossip: &gossip.Config{BindAddr: ln.LocalAddr().String(), Profile: gossip.ProfileFast}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Start(t.Context())
	if err == nil {
		t.Fatal("gossip bound a port in use")
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "pushlb: gossip: ") || strings.Count(msg, "gossip: ") != 1 {
		t.Fatalf("Start: %q, want one \"gossip: \" after \"pushlb: \"", msg)
	}
}
