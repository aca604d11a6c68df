package subscriber_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// regionInstance is an instance of orders named as a region would name
// its own: IDs are unique within a region only.
func regionInstance(id string, i int, region string) serverlist.Instance {
	in := instance("orders", i, time.Now().UnixNano())
	in.InstanceID, in.Region = id, region
	return in
}

// announceIn announces in from a publisher of its own and waits until the
// gateway routes it, has its record, and has handled its online event, so
// that the counters move only for what the test publishes next.
func (g *gateway) announceIn(t *testing.T, srv *natstest.Server, in serverlist.Instance) {
	t.Helper()
	received := g.sub.Stats().Received
	if err := newPublisher(t, srv).Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	g.waitMirrored(t, in)
	testutil.Eventually(t, "the online event handled", func() bool { return g.sub.Stats().Received > received })
	testutil.Eventually(t, "the instance routed", func() bool { return slices.Contains(g.ids(in.Service), in.InstanceID) })
}

// offlineOf is an offline event for in's ID with a later incarnation than
// its (within the clock bound), of region.
func offlineOf(in serverlist.Instance, region string) events.Event {
	return events.Event{Kind: events.Offline, Service: in.Service, InstanceID: in.InstanceID,
		Incarnation: in.Incarnation + 1, At: time.Now(), Region: region}
}

// applyOffline publishes e and waits until an offline event took an
// instance out (OfflineRemovals counts those of events only).
func (g *gateway) applyOffline(t *testing.T, nc *nats.Conn, e events.Event) {
	t.Helper()
	removals := g.sub.Stats().OfflineRemovals
	publishEvent(t, nc, e)
	testutil.Eventually(t, "the offline of region "+e.Region+" to apply", func() bool { return g.sub.Stats().OfflineRemovals > removals })
}

// TestEventsOfAnotherRegionAreDropped: NATS forwards region eu's events to
// a gateway of region us; an offline of eu's "orders-1" must not take out
// us's own "orders-1", and an online of an ID only eu has adds nothing.
// Both are dropped before they touch any state, and counted. An event
// without a region (an announcer older than regions) and one of the own
// region (in any ASCII case) apply.
func TestEventsOfAnotherRegionAreDropped(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{Region: "us"})
	one, two := regionInstance("orders-1", 1, "us"), regionInstance("orders-2", 2, "us")
	g.announceIn(t, srv, one)
	g.announceIn(t, srv, two)
	eu := srv.Connect(t) // region eu's announcers, as the link between the regions delivers them

	before := g.sub.Stats()
	publishEvent(t, eu, offlineOf(one, "eu"))
	publishEvent(t, eu, events.Event{Kind: events.Online, Service: "orders", InstanceID: "orders-9",
		Incarnation: time.Now().UnixNano(), At: time.Now(), Region: "eu"})
	// The drop counter is the proof that both were handled.
	testutil.Eventually(t, "both events of eu dropped", func() bool {
		return g.sub.Stats().Dropped[subscriber.DropOtherRegion] >= 2
	})
	after := g.sub.Stats()
	if d := after.Dropped[subscriber.DropOtherRegion]; d != 2 {
		t.Fatalf("other-region drops %d, want 2", d)
	}
	if after.Applied != before.Applied || after.OfflineRemovals != before.OfflineRemovals ||
		after.Dropped.Total() != before.Dropped.Total()+2 {
		t.Fatalf("the events of eu changed the counters: before %+v, after %+v", before, after)
	}
	if live := g.sub.Live()["orders"]; !slices.Equal(live, []string{"orders-1", "orders-2"}) {
		t.Fatalf("live after eu's events %v, want us's orders-1 and orders-2", live)
	}
	if ids := g.ids("orders"); !slices.Equal(ids, []string{"orders-1", "orders-2"}) {
		t.Fatalf("the balancer lists %v after eu's events, want us's orders-1 and orders-2", ids)
	}

	// No region: the receiver's own, as an announcer older than regions.
	g.applyOffline(t, eu, offlineOf(two, ""))
	// The own region, whatever the ASCII case, as balancers compare regions.
	g.applyOffline(t, eu, offlineOf(one, "US"))
	if d := g.sub.Stats().Dropped[subscriber.DropOtherRegion]; d != 2 {
		t.Fatalf("other-region drops %d after events of the own region, want 2", d)
	}
}

// TestSubscriberWithoutRegionTakesEveryRegion: without Config.Region the
// subscriber behaves as before regions: an event naming any region
// applies.
func TestSubscriberWithoutRegionTakesEveryRegion(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	one := regionInstance("orders-1", 1, "us")
	g.announceIn(t, srv, one)
	g.applyOffline(t, srv.Connect(t), offlineOf(one, "eu"))
	if d := g.sub.Stats().Dropped[subscriber.DropOtherRegion]; d != 0 {
		t.Fatalf("a subscriber without a region dropped %d events as of another region", d)
	}
}

func TestRegionConfig(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	reg := openRegistry(t, nc)
	h := func(context.Context, events.ListChanged) error { return nil }
	for _, region := range []string{strings.Repeat("r", events.MaxRegionLength+1), "eu\xff"} {
		_, err := subscriber.New(nc, reg, h, subscriber.Config{Region: region})
		if !errors.Is(err, subscriber.ErrInvalidConfig) {
			t.Errorf("region %.20q: New = %v, want ErrInvalidConfig", region, err)
		}
	}
	s, err := subscriber.New(nc, reg, h, subscriber.Config{Region: strings.Repeat("r", events.MaxRegionLength)})
	if err != nil {
		t.Fatalf("a region at the limit: %v", err)
	}
	s.Close()
}
