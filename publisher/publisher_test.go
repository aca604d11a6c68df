package publisher_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines(
		// memberlist's Shutdown does not wait for a probe in flight; it ends
		// within the probe's TCP timeout on its own.
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))...)
}

type rig struct {
	srv *natstest.Server
	nc  *nats.Conn
	reg *serverlist.Registry
	evs chan events.Event
}

func newRig(t *testing.T, ttl time.Duration) *rig {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{srv: srv, nc: nc, reg: reg, evs: make(chan events.Event, 16)}
	watcher := srv.Connect(t)
	if _, err := watcher.Subscribe(events.WildcardSubject(events.DefaultPrefix), func(m *nats.Msg) {
		if e, err := events.DecodeMessage(events.DefaultPrefix, m.Subject, m.Data); err == nil {
			r.evs <- e
		}
	}); err != nil {
		t.Fatal(err)
	}
	watcher.Flush()
	return r
}

func (r *rig) next(t *testing.T) events.Event {
	t.Helper()
	select {
	case e := <-r.evs:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	return events.Event{}
}

func (r *rig) registered(t *testing.T, id string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := r.reg.Get(ctx, "orders", id)
	if err != nil && !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

var orders = serverlist.Instance{Service: "orders", InstanceID: "10.0.0.1:orders:8080", Host: "10.0.0.1", Port: 8080, Zone: "a"}

func TestAnnounceThenWithdraw(t *testing.T) {
	r := newRig(t, 5*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Withdraw(t.Context(), ""); !errors.Is(err, publisher.ErrNotAnnounced) {
		t.Fatalf("withdraw before announce: %v", err)
	}
	before := time.Now().UnixNano()
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	if !r.registered(t, orders.InstanceID) {
		t.Fatal("not registered")
	}
	e := r.next(t)
	if e.Kind != events.Online || e.InstanceID != orders.InstanceID || e.Incarnation < before {
		t.Fatalf("online event %+v; incarnation should default to the start time", e)
	}
	if err := p.Withdraw(t.Context(), "shutdown"); err != nil {
		t.Fatal(err)
	}
	off := r.next(t)
	if off.Kind != events.Offline || off.Incarnation != e.Incarnation || off.Reason != "shutdown" {
		t.Fatalf("offline event %+v", off)
	}
	if r.registered(t, orders.InstanceID) {
		t.Fatal("still registered after withdraw")
	}
}

// TestLeaseKeepsEntryAliveAndCloseLetsItExpire: the record is written once
// and the lease beside it is renewed past its TTL, so watchers of the
// records see one put and no renewal; after Close the lease runs out and a
// reaper removes the record.
func TestLeaseKeepsEntryAliveAndCloseLetsItExpire(t *testing.T) {
	const ttl = time.Second
	r := newRig(t, ttl)
	key, err := serverlist.EncodeKey(orders.Service, orders.InstanceID)
	if err != nil {
		t.Fatal(err)
	}
	// The watch sees every write of the record and of its lease, in order:
	// no change can go unseen, so no sleep is needed to prove anything.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	w, err := r.reg.KeyValue().WatchFiltered(ctx, []string{key, key + ".lease", key + ".expired"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	next := func() jetstream.KeyValueEntry {
		t.Helper()
		for {
			select {
			case e := <-w.Updates():
				if e != nil { // nil marks the end of the (empty) initial values
					return e
				}
			case <-ctx.Done():
				t.Fatal("no change of the registry entry")
			}
		}
	}

	p, err := publisher.New(r.nc, r.reg, publisher.Config{LeaseInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	first := next()
	if first.Key() != key || first.Operation() != jetstream.KeyValuePut {
		t.Fatalf("first change %s %v, want the record's put", first.Key(), first.Operation())
	}
	// Renewals of the lease follow one another, and the record is not
	// written again, until the lease has lived longer than its TTL.
	renewals := 0
	for {
		e := next()
		if e.Key() != key+".lease" || e.Operation() != jetstream.KeyValuePut {
			t.Fatalf("after %d renewals: %s %v; want only renewals of the lease", renewals, e.Key(), e.Operation())
		}
		renewals++
		if e.Created().Sub(first.Created()) > ttl {
			break
		}
	}
	t.Logf("%d renewals kept the lease alive past its %v TTL; the record was written once", renewals, ttl)

	// After Close no renewal comes: the next change is the lease's expiry
	// signal (its schedule fired: not renewed for a lease), and the record
	// stays until a reaper removes it.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if !r.reg.ScheduledLeases() {
		t.Fatal("the registry writes plain leases on a bucket made by Open")
	}
	if e := next(); e.Key() != key+".expired" || e.Operation() != jetstream.KeyValuePut {
		t.Fatalf("after Close the next change is %s %v, want the lease's expiry signal", e.Key(), e.Operation())
	}
	if !r.registered(t, orders.InstanceID) {
		t.Fatal("the record went with the lease, without a reaper")
	}
	reaper := serverlist.NewReaper(r.reg, serverlist.ReaperConfig{})
	if err := reaper.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer reaper.Close()
	// The reaper ends the lease, then removes the record. Without a reaper
	// the schedule fires again every period: signals may come between.
	want := []string{key + ".lease", key}
	for len(want) > 0 {
		e := next()
		if e.Key() == key+".expired" {
			continue
		}
		if e.Key() != want[0] || e.Operation() != jetstream.KeyValuePurge {
			t.Fatalf("with a reaper the next change is %s %v, want the removal of %s", e.Key(), e.Operation(), want[0])
		}
		want = want[1:]
	}
	if err := p.Announce(t.Context(), orders); !errors.Is(err, publisher.ErrClosed) {
		t.Fatalf("Announce after Close = %v, want ErrClosed", err)
	}
}

func TestReannounceAfterReconnect(t *testing.T) {
	r := newRig(t, 5*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	first := r.next(t)
	r.srv.Restart(t)
	e := r.next(t)
	if e.Kind != events.Online || e.Incarnation != first.Incarnation {
		t.Fatalf("after reconnect want the same online again, got %+v", e)
	}
}

func TestConfigErrors(t *testing.T) {
	r := newRig(t, time.Second)
	if _, err := publisher.New(r.nc, r.reg, publisher.Config{LeaseInterval: 2 * time.Second}); !errors.Is(err, publisher.ErrInvalidConfig) {
		t.Fatalf("a lease interval above the TTL must be refused: %v", err)
	}
	if _, err := publisher.New(r.nc, r.reg, publisher.Config{Prefix: "bad prefix"}); !errors.Is(err, publisher.ErrInvalidConfig) {
		t.Fatalf("bad prefix: %v", err)
	}
	// The prefix is given once, to the registry: another one is refused.
	if _, err := publisher.New(r.nc, r.reg, publisher.Config{Prefix: "other"}); !errors.Is(err, publisher.ErrInvalidConfig) || !strings.Contains(err.Error(), "registry") {
		t.Fatalf("a prefix other than the registry's: %v", err)
	}
	p, _ := publisher.New(r.nc, r.reg, publisher.Config{})
	if err := p.Announce(t.Context(), serverlist.Instance{Service: "a.b", InstanceID: "x", Host: "h", Port: 1}); err == nil {
		t.Fatal("an invalid service name must be refused")
	}
}

func TestGossipMembership(t *testing.T) {
	r := newRig(t, 5*time.Second)
	type seen struct {
		meta   gossip.Meta
		alive  bool
		reason gossip.Reason
	}
	got := make(chan seen, 16)
	gw, err := gossip.New(gossip.Config{BindAddr: "127.0.0.1:0", Profile: gossip.ProfileFast, Meta: gossip.Meta{Role: gossip.RoleGateway}},
		gossip.HandlerFuncs{
			Alive: func(m gossip.Member) { got <- seen{meta: m.Meta, alive: true} },
			Gone:  func(m gossip.Member, reason gossip.Reason) { got <- seen{meta: m.Meta, reason: reason} },
		})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if err := gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	next := func() seen {
		t.Helper()
		select {
		case s := <-got:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no gossip event")
		}
		return seen{}
	}
	newPub := func() *publisher.Publisher {
		p, err := publisher.New(r.nc, r.reg, publisher.Config{Gossip: &gossip.Config{
			BindAddr: "127.0.0.1:0", Join: []string{gw.LocalAddr()}, Profile: gossip.ProfileFast}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	p := newPub()
	in := orders
	in.Incarnation = 41
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if s := next(); !s.alive || s.meta.Service != "orders" || s.meta.InstanceID != in.InstanceID || s.meta.Incarnation != 41 {
		t.Fatalf("want the instance alive with its meta, got %+v", s)
	}
	if err := p.Withdraw(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	// A graceful leave; a peer that missed the leave's "leaving" flag (it
	// was gossiped a moment after joining) reports the node dead instead,
	// which the gateway treats the same way.
	if s := next(); s.alive || s.meta.Incarnation != 41 {
		t.Fatalf("withdraw: want the node gone, got %+v", s)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// Close without Withdraw is a crash for gossip: the node is declared dead.
	p2 := newPub()
	in.Incarnation = 42
	if err := p2.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if s := next(); !s.alive || s.meta.Incarnation != 42 {
		t.Fatalf("got %+v", s)
	}
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	if s := next(); s.alive || s.reason != gossip.ReasonDead || s.meta.Incarnation != 42 {
		t.Fatalf("close: want dead, got %+v", s)
	}
}
