package subscriber_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// leasedPublisher is a publisher over a bucket whose TTL is ttl (created by
// the first Open), refreshing every interval.
func leasedPublisher(t *testing.T, srv *natstest.Server, ttl, interval time.Duration) *publisher.Publisher {
	t.Helper()
	nc := srv.Connect(t, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	p, err := publisher.New(nc, openRegistryTTL(t, nc, ttl), publisher.Config{LeaseInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func (g *gateway) live(service, id string) bool { return slices.Contains(g.sub.Live()[service], id) }

// waitMirrored waits until the instance is live and its record is in the
// gateway's mirror. An online event can make it live before the mirror
// has its record; an offline forged then is undone at once by the
// record's put, a registry write after it.
func (g *gateway) waitMirrored(t *testing.T, in serverlist.Instance) {
	t.Helper()
	testutil.Eventually(t, "the instance live and its record mirrored", func() bool {
		_, ok := g.sub.Mirror().Entry(in.Service, in.InstanceID)
		return ok && g.live(in.Service, in.InstanceID)
	})
}

// forgeOffline publishes an offline for in's ID with a later incarnation
// (within the clock bound) from nc, and waits until it applied: the
// Applied counter proves it, where the instance's absence may last only
// until the next registry write.
func (g *gateway) forgeOffline(t *testing.T, nc *nats.Conn, in serverlist.Instance) {
	t.Helper()
	applied := g.sub.Stats().Applied
	publishEvent(t, nc, events.Event{Kind: events.Offline, Service: in.Service, InstanceID: in.InstanceID,
		Incarnation: time.Now().Add(50 * time.Minute).UnixNano(), At: time.Now()})
	testutil.Eventually(t, "the forged offline to apply", func() bool { return g.sub.Stats().Applied > applied })
}

// TestForgedOfflineLastsUntilTheNextRegistryWrite: an offline event that
// claims a later incarnation than the instance's (any within the clock
// bound) takes a healthy instance out only until the gateway's lease probe
// sees a renewal, which the registry orders after the offline; one beyond the bound is
// dropped as "future" and changes nothing.
func TestForgedOfflineLastsUntilTheNextRegistryWrite(t *testing.T) {
	const interval = 500 * time.Millisecond
	srv := natstest.Start(t)
	p := leasedPublisher(t, srv, 3*time.Second, interval)
	g := startGateway(t, srv, subscriber.Config{})
	in := instance("orders", 1, time.Now().UnixNano())
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the instance routed", func() bool { return slices.Equal(g.ids("orders"), []string{in.InstanceID}) })
	g.waitMirrored(t, in)
	forger := srv.Connect(t)

	// Beyond the bound: dropped and counted, nothing changes.
	// The drop's count is the proof the event was handled (Received may
	// count another message first: a lease renewal's, an online's).
	publishEvent(t, forger, events.Event{Kind: events.Offline, Service: "orders", InstanceID: in.InstanceID, Incarnation: 1<<63 - 1, At: time.Now()})
	testutil.Eventually(t, "the forged event to be dropped as from the future", func() bool { return g.sub.Stats().Dropped[subscriber.DropFuture] >= 1 })
	if d := g.sub.Stats().Dropped[subscriber.DropFuture]; d != 1 {
		t.Fatalf("future drops %d, want 1", d)
	}
	if !g.live("orders", in.InstanceID) {
		t.Fatal("a forged offline with the largest incarnation took the instance out")
	}

	// Within the bound: it applies, until the next refresh.
	out := time.Now()
	g.forgeOffline(t, forger, in)
	testutil.Eventually(t, "the next refresh to bring the instance back", func() bool { return g.live("orders", in.InstanceID) })
	took := time.Since(out)
	testutil.Eventually(t, "the instance routed again", func() bool { return slices.Equal(g.ids("orders"), []string{in.InstanceID}) })
	// The lease probe brought it back: a read a sixth of the TTL after the
	// offline (at most 1 s), another a third of the TTL later (about 1.5 s
	// on an idle machine: logged, not asserted).
	t.Logf("a forged offline kept the instance out %v (refresh interval %v)", took, interval)
	if st := g.sub.Stats(); st.RegistryRevivals == 0 || st.LeaseProbeReads < 2 {
		t.Fatalf("revivals %d, lease probe reads %d: the probe's revival should be counted", st.RegistryRevivals, st.LeaseProbeReads)
	}

	// Events still order within the registry's incarnation: the real
	// offline applies.
	if err := p.Withdraw(t.Context(), "shutdown"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the real withdrawal", func() bool { return len(g.ids("orders")) == 0 })
}

// TestRestartIsRoutedWhateverAnOfflineClaimed: after a forged offline that
// claimed a far later incarnation, the restarted real instance (a lower
// incarnation, its start time) is routed: its registration is a later
// registry write.
func TestRestartIsRoutedWhateverAnOfflineClaimed(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{})
	in := instance("orders", 1, time.Now().UnixNano())
	p := newPublisher(t, srv)
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	g.waitMirrored(t, in)
	g.forgeOffline(t, g.nc, in)
	if err := p.Withdraw(t.Context(), "shutdown"); err != nil { // the instance stops...
		t.Fatal(err)
	}
	restarted := in
	restarted.Incarnation, restarted.Port = time.Now().UnixNano(), 9999 // ...and starts again
	if err := newPublisher(t, srv).Announce(t.Context(), restarted); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the restarted instance to be routed", func() bool {
		return slices.Equal(g.servers("orders"), []string{in.InstanceID + "@10.0.0.1:9999/b"})
	})
}

// TestLostBucketIsRecreatedAndResynced: NATS comes back without its store.
// The gateway's mirror recreates the bucket, the publishers re-register,
// and the gateway routes them again; the registry holds them.
func TestLostBucketIsRecreatedAndResynced(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{Mirror: serverlist.MirrorConfig{RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond}})
	var ids []string
	for i := 1; i <= 2; i++ {
		in := instance("orders", i, time.Now().UnixNano())
		if err := newPublisher(t, srv).Announce(t.Context(), in); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.InstanceID)
	}
	testutil.Eventually(t, "both instances", func() bool { return slices.Equal(g.ids("orders"), ids) })

	began := time.Now()
	srv.RestartWithoutStore(t)
	testutil.Eventually(t, "the gateway to resync over the new bucket", func() bool { return g.sub.Mirror().Stats().Syncs >= 2 })
	testutil.Eventually(t, "the registry to hold both again", func() bool {
		list, err := g.reg.List(t.Context(), "orders")
		return err == nil && len(list) == 2
	})
	testutil.Eventually(t, "the gateway to route both", func() bool {
		return slices.Equal(g.ids("orders"), ids) && slices.Equal(g.sub.Live()["orders"], ids)
	})
	t.Logf("recovered %v after the restart without store; mirror %+v", time.Since(began), g.sub.Mirror().Stats())
}

// TestWithdrawalCostsNoLeaseRead: a real withdrawal costs the registry no
// lease read. Its offline event and its record's removal travel on two
// subscriptions and may come in either order: event first, the event
// starts a lease probe, which finds the record gone when it looks and ends
// without a read; removal first, no probe starts. The test asserts what
// holds in both: once both are processed and no probe runs, nothing was
// read and nothing revived.
func TestWithdrawalCostsNoLeaseRead(t *testing.T) {
	srv := natstest.Start(t)
	p := leasedPublisher(t, srv, 3*time.Second, time.Second)
	g := startGateway(t, srv, subscriber.Config{})
	in := instance("orders", 1, time.Now().UnixNano())
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the instance routed", func() bool { return g.live("orders", in.InstanceID) })
	received := g.sub.Stats().Received // the online event, handled
	if err := p.Withdraw(t.Context(), "shutdown"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the offline event handled and the record's removal mirrored", func() bool {
		_, inMirror := g.sub.Mirror().Entry("orders", in.InstanceID)
		return g.sub.Stats().Received > received && !inMirror && !g.live("orders", in.InstanceID)
	})
	// A probe the event started ends within its settle time, whatever the
	// order: it looks at the mirror once, and the record is gone.
	testutil.Eventually(t, "no lease probe running", func() bool { return subscriber.LeaseProbesInFlight(g.sub) == 0 })
	st := g.sub.Stats()
	if st.LeaseProbeReads != 0 || st.RegistryRevivals != 0 {
		t.Fatalf("a withdrawal's probe read the lease %d times, revived %d", st.LeaseProbeReads, st.RegistryRevivals)
	}
	t.Logf("lease probes that ended: %d (0: the removal came first)", st.LeaseProbes)
}
