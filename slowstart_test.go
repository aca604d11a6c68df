package pushlb_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer/lbconfig"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// Slow start through the library: the YAML key reaches the service's
// balancer; the instance listed when the client starts does not ramp, and
// one announced afterwards does, over real NATS and real backends: under
// RoundRobin it gets its minimum weight (10 %) against the other's full
// weight, 1 request in 11, for the first minute of its 10-minute window
// (the live weights are refreshed every 30 s and stay at the floor until
// 60 s).
func TestSlowStartFromYAML(t *testing.T) {
	cc, err := lbconfig.LoadYAML(strings.NewReader("clients:\n  orders:\n    rule: RoundRobin\n    slowStart: {window: 10m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	c := startWith(t, srv.Connect(t), pushlb.Config{Balancers: cc})
	client := &http.Client{Transport: c.Transport()}
	if got := get(t, client, "http://orders/x"); !strings.HasPrefix(got, "a ") {
		t.Fatalf("first answer %q", got)
	}
	bal, err := c.Balancer("orders")
	if err != nil {
		t.Fatal(err)
	}
	if got := bal.Config().SlowStart; got.Window != 10*time.Minute || got.MinWeightPercent != 10 || got.Aggression != 1 {
		t.Fatalf("the balancer's slow start: %+v", got)
	}

	announce(t, srv, "orders", "", testpub.Backend(t, "b"))
	testutil.Eventually(t, "both instances", func() bool { return len(bal.Servers()) == 2 })
	const n = 440
	hits := map[string]int{}
	for range n {
		hits[get(t, client, "http://orders/x")[:1]]++
	}
	share := float64(hits["b"]) / n
	t.Logf("the new instance's share: %.3f (curve: 1/11 = %.3f); hits %v", share, 1.0/11, hits)
	if share < 0.05 || share > 0.14 {
		t.Fatalf("the new instance got %.3f of the traffic, want about 1/11 (its 10 %% floor)", share)
	}
}
