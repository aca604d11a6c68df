package scale_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestRefreshesCostNothing: lease renewals of a whole fleet never reach a
// started client (its mirror watches the records, not the leases), and the
// refreshes of protocol version 1 (every record put again, unchanged) that
// do reach it cause no reconciliation (the mirror's OnChange feeds them), no
// delivered list, no balancer update and no lookup: only the mirror's
// refresh counter moves.
func TestRefreshesCostNothing(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nb := bus{url: srv.URL(), replicas: 1, connect: func(tb testing.TB) *nats.Conn { return srv.Connect(tb) }}
	sz := scale.Size{Services: 5, Instances: 40, Gateways: 1}
	f, recs, _ := loadFleet(t, nb, sz)

	c, err := pushlb.New(srv.Connect(t), pushlb.Config{Follow: pushlb.FollowAll, AntiEntropy: time.Hour, Reaper: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Start returns once every list is delivered; the registry's second
	// delivery of a service (its OnChange at the sync) may follow it.
	// Settled: the same counts over 50 polls (100 ms).
	var before pushlb.Stats
	stable := 0
	testutil.Eventually(t, "the client to settle", func() bool {
		prev := before
		before = c.Stats()
		if prev.Events.Delivered != before.Events.Delivered || prev.Events.Reconciles != before.Events.Reconciles {
			stable = 0
		}
		stable++
		return stable >= 50
	})

	const rounds = 5
	for range rounds {
		if err := f.RenewLeases(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	// Refreshes of the records themselves, after the renewals: the server
	// delivers in the stream's order, so once the mirror saw these, any
	// renewal it were sent would have reached it before.
	if err := f.RefreshRecords(ctx, recs); err != nil {
		t.Fatal(err)
	}
	n := uint64(len(recs))
	testutil.Eventually(t, "the mirror to see the record refreshes", func() bool {
		return c.Stats().Registry.Refreshes-before.Registry.Refreshes >= n
	})
	after := c.Stats()
	if got := after.Registry.Refreshes - before.Registry.Refreshes; got != n {
		t.Errorf("%d refreshes seen, want %d: the %d lease renewals must not reach the mirror", got, n, rounds*len(recs))
	}

	if after.Events.Reconciles != before.Events.Reconciles {
		t.Errorf("refreshes caused %d reconciliations (the mirror's OnChange)", after.Events.Reconciles-before.Events.Reconciles)
	}
	if after.Events.Delivered != before.Events.Delivered {
		t.Errorf("refreshes caused %d list deliveries", after.Events.Delivered-before.Events.Delivered)
	}
	if after.Lookups != before.Lookups {
		t.Errorf("refreshes caused lookups: %+v, before %+v", after.Lookups, before.Lookups)
	}
	for i, s := range after.Services {
		if s.Updates != before.Services[i].Updates || s.Servers != sz.Instances {
			t.Errorf("service %s: %d servers, %d list updates during the refreshes", s.Name, s.Servers, s.Updates-before.Services[i].Updates)
		}
	}
}
