package gateway

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testpub"
	"github.com/pushlb/pushlb/internal/testutil"
	"github.com/pushlb/pushlb/subscriber"
)

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// The two floods of the trust issue: 20,000 online events for invented
// services, and 2,000 invented instance IDs of a real service. They build
// no balancer, leave memory within 2x of idle and /metrics small, and a real
// withdrawal sent right behind them still applies at once.
func TestFloodsStayBounded(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.ConfirmWithin = 200 * time.Millisecond
	g := startGateway(t, cfg)
	announce(t, g, "orders", "", testpub.Backend(t, "keep"))
	gone := announce(t, g, "orders", "", testpub.Backend(t, "gone"))
	testutil.Eventually(t, "both instances", func() bool {
		s := g.State().Services
		return len(s) == 1 && len(s[0].Servers) == 2
	})
	nc, err := nats.Connect(g.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_, idleMetrics := get(t, "http://"+g.AdminAddr()+"/metrics")
	idle := heapInUse()

	at := time.Now()
	publish := func(service, id string) {
		data, err := events.Encode(events.Event{Service: service, InstanceID: id, Incarnation: at.UnixNano(), At: at})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(events.Subject(events.DefaultPrefix, service, events.Online), data); err != nil {
			t.Fatal(err)
		}
	}
	const services, ids = 20000, 2000
	for i := range services {
		publish(fmt.Sprintf("invented-%d", i), "x")
	}
	for i := range ids {
		publish("orders", fmt.Sprintf("invented-%d", i))
	}
	nc.Flush()
	start := time.Now()
	if err := gone.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the real offline to apply", func() bool {
		s := g.State().Services
		return len(s) == 1 && len(s[0].Servers) == 1
	})
	lag := time.Since(start)
	received := func() uint64 { return g.client.Stats().Events.Received }
	testutil.Eventually(t, "the flood to be processed", func() bool { return received() >= services+ids+3 })
	st := g.client.Stats()
	admitted := services + ids - st.Events.Dropped[subscriber.DropLimit]
	testutil.Eventually(t, "the invented instances to be forgotten", func() bool {
		return g.client.Stats().Events.Unconfirmed >= admitted
	})
	if n := len(g.client.Stats().Services); n != 1 {
		t.Fatalf("%d balancers after the flood, want 1", n)
	}
	for range 10 {
		if _, body := get(t, "http://"+g.ProxyAddr()+"/orders/x"); body != "keep /x" {
			t.Fatalf("after the flood: %q", body)
		}
	}
	_, metrics := get(t, "http://"+g.AdminAddr()+"/metrics")
	after := heapInUse()
	t.Logf("real offline applied %v after its withdrawal, behind %d invented services and %d invented IDs (limit drops %d); heap in use %.1f MB idle, %.1f MB after; /metrics %d -> %d bytes",
		lag, services, ids, st.Events.Dropped.Total(), float64(idle)/1e6, float64(after)/1e6, len(idleMetrics), len(metrics))
	if lag > time.Second {
		t.Errorf("the real offline took %v behind the flood", lag)
	}
	if after > 2*idle {
		t.Errorf("heap in use grew from %d to %d bytes (more than 2x)", idle, after)
	}
	if strings.Contains(metrics, "invented") || len(metrics) > 2*len(idleMetrics) {
		t.Errorf("/metrics grew from %d to %d bytes", len(idleMetrics), len(metrics))
	}
}
