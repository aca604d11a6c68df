package subscriber_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// balancers is a minimal balancer.Balancers for tests: one balancer per
// service with the default config.
type balancers struct {
	mu sync.Mutex
	m  map[string]*balancer.Balancer
}

func (b *balancers) Get(name string) (*balancer.Balancer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*balancer.Balancer{}
	}
	if bal := b.m[name]; bal != nil {
		return bal, nil
	}
	bal, err := balancer.New(name, balancer.DefaultConfig())
	if err != nil {
		return nil, err
	}
	b.m[name] = bal
	return bal, nil
}

func (b *balancers) get(name string) *balancer.Balancer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[name]
}

func (b *balancers) Remove(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	bal := b.m[name]
	if bal != nil {
		bal.Close()
		delete(b.m, name)
	}
	return bal != nil
}

func (b *balancers) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bal := range b.m {
		bal.Close()
	}
}

var _ lbvisitor.Balancers = (*balancers)(nil)

// gateway is the gateway side of the push path, wired as cmd/gateway does.
type gateway struct {
	nc   *nats.Conn
	reg  *serverlist.Registry
	bals *balancers
	svcs *lbvisitor.Services
	sub  *subscriber.Subscriber

	mu      sync.Mutex
	handled []events.ListChanged // lists the visitors finished applying
}

// handle is the subscriber's Handler: it applies lc and then records it, so
// a test can wait for a list to have been applied.
func (g *gateway) handle(ctx context.Context, lc events.ListChanged) error {
	err := g.svcs.Handle(ctx, lc)
	g.mu.Lock()
	g.handled = append(g.handled, lc)
	g.mu.Unlock()
	return err
}

// appliedWith reports whether a list of service holding id has been
// applied to its balancer (lookups done, SetServers returned).
func (g *gateway) appliedWith(service, id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, lc := range g.handled {
		if lc.Service == service && slices.Contains(lc.InstanceIDs, id) {
			return true
		}
	}
	return false
}

func openRegistry(t testing.TB, nc *nats.Conn) *serverlist.Registry {
	t.Helper()
	return openRegistryTTL(t, nc, 5*time.Second)
}

func openRegistryTTL(t testing.TB, nc *nats.Conn, ttl time.Duration) *serverlist.Registry {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func startGateway(t testing.TB, srv *natstest.Server, cfg subscriber.Config) *gateway {
	t.Helper()
	g := &gateway{nc: srv.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond)), bals: &balancers{}}
	g.svcs = lbvisitor.NewServices(g.bals, lbvisitor.ServicesConfig{Logger: nopLog})
	g.reg = openRegistry(t, g.nc)
	var lookup *serverlist.Lookup
	sub, err := subscriber.New(g.nc, g.reg, g.handle, cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.sub = sub
	lookup, err = serverlist.NewLookup(g.reg, sub.Mirror(), serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	g.svcs.Resolve(lookup)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Errorf("subscriber Close: %v", err)
		}
		g.bals.close()
	})
	return g
}

// servers returns "id@host:port/zone" of a service's balancer, sorted.
func (g *gateway) servers(service string) []string {
	b := g.bals.get(service)
	if b == nil {
		return nil
	}
	var out []string
	for _, s := range b.AllServers() {
		out = append(out, fmt.Sprintf("%s@%s/%s", s.ID, s.Addr(), s.Zone))
	}
	sort.Strings(out)
	return out
}

func (g *gateway) ids(service string) []string {
	b := g.bals.get(service)
	if b == nil {
		return nil
	}
	var out []string
	for _, s := range b.AllServers() {
		out = append(out, s.ID)
	}
	sort.Strings(out)
	return out
}

func instance(service string, i int, inc int64) serverlist.Instance {
	return serverlist.Instance{
		Service: service, InstanceID: fmt.Sprintf("10.0.0.%d:%s:8080", i, service),
		Host: fmt.Sprintf("10.0.0.%d", i), Port: 8080 + i, Zone: []string{"a", "b"}[i%2], Incarnation: inc,
	}
}

func newPublisher(t testing.TB, srv *natstest.Server) *publisher.Publisher {
	t.Helper()
	nc := srv.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	p, err := publisher.New(nc, openRegistry(t, nc), publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("publisher Close: %v", err)
		}
	})
	return p
}

func TestAnnounceWithdrawRestart(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	ctx := t.Context()

	var pubs []*publisher.Publisher
	for i := 1; i <= 3; i++ {
		p := newPublisher(t, srv)
		if err := p.Announce(ctx, instance("orders", i, 100)); err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	want := []string{
		"10.0.0.1:orders:8080@10.0.0.1:8081/b",
		"10.0.0.2:orders:8080@10.0.0.2:8082/a",
		"10.0.0.3:orders:8080@10.0.0.3:8083/b",
	}
	testutil.Eventually(t, "3 servers with the registry's host, port and zone", func() bool { return slices.Equal(g.servers("orders"), want) })

	if err := pubs[1].Withdraw(ctx, "shutdown"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "2 servers after a withdraw", func() bool { return len(g.ids("orders")) == 2 })
	if slices.Contains(g.ids("orders"), "10.0.0.2:orders:8080") {
		t.Fatal("withdrawn instance still listed")
	}

	// Restart with a higher incarnation, on another port.
	restarted := instance("orders", 2, 200)
	restarted.Port = 9999
	if err := pubs[1].Announce(ctx, restarted); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "3 servers after the restart", func() bool {
		return slices.Contains(g.servers("orders"), "10.0.0.2:orders:8080@10.0.0.2:9999/a")
	})

	// A delayed offline of the old incarnation is ignored.
	dropped := g.sub.Stats().Dropped[subscriber.DropStale]
	publishEvent(t, g.nc, events.Event{Kind: events.Offline, Service: "orders", InstanceID: "10.0.0.2:orders:8080", Incarnation: 100, At: time.Now()})
	testutil.Eventually(t, "the stale offline to be counted", func() bool { return g.sub.Stats().Dropped[subscriber.DropStale] > dropped })
	if len(g.ids("orders")) != 3 {
		t.Fatalf("a stale offline removed the restarted instance: %v", g.ids("orders"))
	}
}

func publishEvent(t testing.TB, nc *nats.Conn, e events.Event) {
	t.Helper()
	subj, data, err := events.EncodeMessage(events.DefaultPrefix, e)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subj, data); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestLateSubscriberGetsFullStateBeforeServing(t *testing.T) {
	srv := natstest.Start(t)
	ctx := t.Context()
	for i := 1; i <= 5; i++ {
		if err := newPublisher(t, srv).Announce(ctx, instance("billing", i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	g := startGateway(t, srv, subscriber.Config{})
	// Start returned: the deliveries are under way; the first rebuild must
	// hold all five without any further event.
	testutil.Eventually(t, "all 5 instances", func() bool { return len(g.ids("billing")) == 5 })
	if got := g.sub.Live()["billing"]; len(got) != 5 {
		t.Fatalf("membership after Start: %v", got)
	}
}

func TestOnlineEventWithoutRegistryEntryRoutesNothing(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	if err := newPublisher(t, srv).Announce(t.Context(), instance("cart", 1, 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the registered instance", func() bool { return len(g.ids("cart")) == 1 })
	publishEvent(t, g.nc, events.Event{Kind: events.Online, Service: "cart", InstanceID: "ghost:cart:1", Incarnation: 1, At: time.Now()})
	testutil.Eventually(t, "the ghost to reach the membership", func() bool { return len(g.sub.Live()["cart"]) == 2 })
	// The visitor's lookup retries with backoff, then leaves the ghost out:
	// wait until a list holding the ghost has been applied.
	testutil.Eventually(t, "a list with the ghost to be applied", func() bool { return g.appliedWith("cart", "ghost:cart:1") })
	if got := g.ids("cart"); len(got) != 1 || got[0] != "10.0.0.1:cart:8080" {
		t.Fatalf("an unregistered ID was routed: %v", got)
	}
	v := g.svcs.Lookup("cart").Visitor()
	if v.Stats().NotFound == 0 {
		t.Fatalf("the ghost's lookup should count as not found: %+v", v.Stats())
	}
}

func TestBadInputIsDroppedAndCounted(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	if err := newPublisher(t, srv).Announce(t.Context(), instance("orders", 1, 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the instance", func() bool { return len(g.ids("orders")) == 1 })

	big := make([]byte, events.MaxPayloadSize+1)
	for subj, data := range map[string][]byte{
		"lb.svc.orders.online":             []byte(`{not json`),
		"lb.svc.orders.offline":            []byte(`{"service":"orders","instanceId":"10.0.0.1:orders:8080","incarnation":"1","at":"2026-01-01T00:00:00Z"}`),
		"lb.svc.orders.online.extra":       []byte(`{}`),
		"lb.svc.orders.sideways":           []byte(`{}`),
		"lb.svc.other.offline":             []byte(`{"service":"orders","instanceId":"10.0.0.1:orders:8080","incarnation":1,"at":"2026-01-01T00:00:00Z"}`),
		"lb.svc.orders.offline ":           big,
		"lb.svc.bad*name.online":           []byte(`{}`),
		"lb.svc.orders.offline\x00":        nil,
		"lb.svc.orders.online\u00e9":       []byte(`{"v":99}`),
		"lb.svc.orders.online\u00e9\u00e9": []byte(`[]`),
	} {
		g.nc.Publish(subj, data) // some are refused by the client itself; that is fine
	}
	g.nc.Publish("lb.svc.orders.offline", big)
	g.nc.Flush()
	testutil.Eventually(t, "drops to be counted", func() bool {
		d := g.sub.Stats().Dropped
		return d[subscriber.DropMalformed] >= 1 && d[subscriber.DropTooLarge] >= 1 && d[subscriber.DropMismatch] >= 1 && d[subscriber.DropBadSubject] >= 1
	})
	if got := g.ids("orders"); len(got) != 1 {
		t.Fatalf("bad input changed the healthy list: %v", got)
	}
}

func TestNATSRestartConverges(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	ctx := t.Context()
	p1, p2, p3 := newPublisher(t, srv), newPublisher(t, srv), newPublisher(t, srv)
	for i, p := range []*publisher.Publisher{p1, p2} {
		if err := p.Announce(ctx, instance("orders", i+1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "2 instances", func() bool { return len(g.ids("orders")) == 2 })

	srv.Restart(t)
	// While everyone reconnects, one instance withdraws and another arrives.
	// Each attempt is bounded; Eventually bounds the retries while the
	// clients reconnect.
	attempt := func(op func(context.Context) error) bool {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return op(actx) == nil
	}
	testutil.Eventually(t, "p1 to withdraw after the restart", func() bool {
		return attempt(func(ctx context.Context) error {
			err := p1.Withdraw(ctx, "shutdown")
			if err != nil {
				p1.Announce(ctx, instance("orders", 1, 1)) // the withdraw failed half-way: restore, try again
			}
			return err
		})
	})
	testutil.Eventually(t, "p3 to announce after the restart", func() bool {
		return attempt(func(ctx context.Context) error { return p3.Announce(ctx, instance("orders", 3, 1)) })
	})
	truth := func() []string {
		ins, err := g.reg.List(ctx, "orders")
		if err != nil {
			return nil
		}
		var ids []string
		for _, in := range ins {
			ids = append(ids, in.InstanceID)
		}
		sort.Strings(ids)
		return ids
	}
	want := []string{"10.0.0.2:orders:8080", "10.0.0.3:orders:8080"}
	testutil.Eventually(t, "the registry's truth", func() bool { return slices.Equal(truth(), want) })
	testutil.Eventually(t, "the gateway to equal the registry", func() bool { return slices.Equal(g.ids("orders"), want) })
}

func TestSlowHandlerDoesNotDelayOtherServices(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	reg := openRegistry(t, nc)
	release := make(chan struct{})
	got := make(chan events.ListChanged, 100)
	sub, err := subscriber.New(nc, reg, func(ctx context.Context, lc events.ListChanged) error {
		if lc.Service == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
		got <- lc
		return nil
	}, subscriber.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	defer close(release)
	p := newPublisher(t, srv)
	if err := p.Announce(t.Context(), instance("slow", 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := newPublisher(t, srv).Announce(t.Context(), instance("fast", 1, 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case lc := <-got:
		if lc.Service != "fast" || len(lc.InstanceIDs) != 1 {
			t.Fatalf("got %+v", lc)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the fast service waited for the slow handler")
	}
}

func TestBurstIsCoalesced(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	reg := openRegistry(t, nc)
	const sentinel = "i-last"
	var mu sync.Mutex
	calls := 0
	final := make(chan int, 1) // the number of calls up to the sentinel's list
	sub, err := subscriber.New(nc, reg, func(ctx context.Context, lc events.ListChanged) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if slices.Contains(lc.InstanceIDs, sentinel) {
			if len(lc.InstanceIDs) != 102 {
				t.Errorf("the list after the burst has %d IDs, want 102", len(lc.InstanceIDs))
			}
			select {
			case final <- n:
			default:
			}
		}
		// Simulated work, not an ordering: a rebuild takes a moment, so
		// changes pile up while the handler runs.
		time.Sleep(time.Millisecond)
		return nil
	}, subscriber.Config{Coalesce: 20 * time.Millisecond, Services: []string{"orders"}})
	if err != nil {
		t.Fatal(err)
	}
	// One registered instance makes the service one the registry holds:
	// the lists of a service known from events alone wait for the registry.
	if _, err := reg.Register(t.Context(), instance("orders", 200, 1)); err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// A rolling restart of 100 instances: offline then online with a new
	// incarnation, published as fast as possible (events only: within
	// ConfirmWithin the membership follows them without the registry). Then one more
	// instance: one subscription delivers in order, so the first list that
	// holds it was built after all 300 events were applied.
	pubc := srv.Connect(t)
	for i := range 100 {
		id := fmt.Sprintf("i-%d", i)
		publishEvent(t, pubc, events.Event{Kind: events.Online, Service: "orders", InstanceID: id, Incarnation: 1, At: time.Now()})
	}
	for i := range 100 {
		id := fmt.Sprintf("i-%d", i)
		publishEvent(t, pubc, events.Event{Kind: events.Offline, Service: "orders", InstanceID: id, Incarnation: 1, At: time.Now()})
		publishEvent(t, pubc, events.Event{Kind: events.Online, Service: "orders", InstanceID: id, Incarnation: 2, At: time.Now()})
	}
	publishEvent(t, pubc, events.Event{Kind: events.Online, Service: "orders", InstanceID: sentinel, Incarnation: 1, At: time.Now()})
	var n int
	select {
	case n = <-final:
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery holds the last event")
	}
	t.Logf("301 events, %d deliveries", n)
	if n > 30 {
		t.Fatalf("301 events gave %d deliveries; want a handful", n)
	}
}

var nopLog = zerologNop()

// TestLeaseExpiryRemovesCrashedInstance: with gossip off, an instance whose
// process dies (no offline, no lease refresh) leaves the gateway's list
// once its registry lease expires.
func TestLeaseExpiryRemovesCrashedInstance(t *testing.T) {
	const ttl = time.Second
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	reg := openRegistryTTL(t, nc, ttl) // the first Open creates the bucket: the TTL is its
	g := startGateway(t, srv, subscriber.Config{})
	crashing, err := publisher.New(nc, reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	staying, err := publisher.New(nc, reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer staying.Close()
	if err := crashing.Announce(t.Context(), instance("orders", 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := staying.Announce(t.Context(), instance("orders", 2, 1)); err != nil {
		t.Fatal(err)
	}
	// The reaper turns the end of a lease into the record's removal (a
	// gateway's pushlb.Client runs one).
	reaper := serverlist.NewReaper(reg, serverlist.ReaperConfig{})
	if err := reaper.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer reaper.Close()
	testutil.Eventually(t, "both instances and their online events", func() bool {
		return len(g.ids("orders")) == 2 && g.sub.Stats().Received == 2
	})
	crashing.Close() // the lease loop stops, nothing is announced: a crash
	began := time.Now()
	testutil.Eventually(t, "the crashed instance to leave", func() bool { return len(g.ids("orders")) == 1 })
	t.Logf("lease path: crashed instance removed %v after the crash (TTL %v)", time.Since(began), ttl)
	if got := g.ids("orders"); got[0] != instance("orders", 2, 1).InstanceID {
		t.Fatalf("the wrong instance left: %v", got)
	}
	// The lease's end took it out: the reaper saw the lease end and
	// removed the record, the gateway counted a registry removal, and no
	// event came.
	testutil.Eventually(t, "the reaper to count the removal", func() bool { st := reaper.Stats(); return st.LeasesEnded == 1 && st.Reaped == 1 })
	if st := g.sub.Stats(); st.RegistryRemovals == 0 || st.Received != 2 {
		t.Fatalf("registry removals %d, events %d; want the removal counted as a registry removal, no event after the two online", st.RegistryRemovals, st.Received)
	}
}

func TestGossipGoneAndAlive(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	p := newPublisher(t, srv)
	in := instance("orders", 1, 7)
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the instance", func() bool { return len(g.ids("orders")) == 1 })
	g.waitMirrored(t, in)                        // else the record's put, after the death, undoes it
	g.sub.GossipGone("orders", in.InstanceID, 6) // an older incarnation: ignored
	g.sub.GossipGone("orders", in.InstanceID, 7)
	testutil.Eventually(t, "gossip to remove it", func() bool { return len(g.ids("orders")) == 0 })
	g.sub.GossipAlive("orders", in.InstanceID, 7) // refuted
	testutil.Eventually(t, "gossip to restore it", func() bool { return len(g.ids("orders")) == 1 })
	if st := g.sub.Stats(); st.GossipRemovals != 1 || st.GossipRevivals != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Events naming instances nobody registered are forgotten once the
// registry has not shown them for ConfirmWithin, and events beyond the
// limits are dropped and counted: a flood cannot grow the table.
func TestUnregisteredInstancesAreForgottenAndLimited(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{ConfirmWithin: 100 * time.Millisecond, MaxUnconfirmed: 50, MaxServices: 1000, MaxInstancesPerService: 1000})
	if err := newPublisher(t, srv).Announce(t.Context(), instance("cart", 1, 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the registered instance", func() bool { return len(g.ids("cart")) == 1 })
	now := time.Now()
	for i := range 80 {
		publishEvent(t, g.nc, events.Event{Kind: events.Online, Service: fmt.Sprintf("invented-%d", i), InstanceID: "x", Incarnation: 1, At: now})
	}
	testutil.Eventually(t, "the 80 events (and the online of cart) to be processed", func() bool { return g.sub.Stats().Received >= 81 })
	// Each event is either dropped for the limit or admitted and, the
	// registry never showing it, forgotten: at most 50 are held at once.
	limited := g.sub.Stats().Dropped[subscriber.DropLimit]
	if limited < 1 {
		t.Fatalf("no event was dropped for the limit of 50 unconfirmed instances")
	}
	testutil.Eventually(t, "the invented instances to be forgotten", func() bool { return g.sub.Stats().Unconfirmed == 80-limited })
	live := g.sub.Live()
	if len(live) != 1 || len(live["cart"]) != 1 {
		t.Fatalf("membership after the flood: %v", live)
	}
	// The limit is free again: a new registration and its event go through.
	if err := newPublisher(t, srv).Announce(t.Context(), instance("cart", 2, 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the second instance", func() bool { return len(g.ids("cart")) == 2 })
}
