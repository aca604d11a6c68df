package pushlb_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
)

// A live instance's weight changes by announcing it again: the record
// update reaches the gateway's balancer over NATS like any other change,
// and the traffic follows (default rule, real backends, real NATS).
func TestWeightChangeReachesTheBalancer(t *testing.T) {
	srv := natstest.Start(t)
	a := announce(t, srv, "orders", "", testpub.Backend(t, "a"))
	announce(t, srv, "orders", "", testpub.Backend(t, "b"))
	c := start(t, srv.Connect(t))
	client := &http.Client{Transport: c.Transport()}
	bal, err := c.Follow(t.Context(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "both instances", func() bool { return len(bal.Servers()) == 2 })

	weightOf := func(id string) int {
		for _, s := range bal.Servers() {
			if s.ID == id {
				return s.Weight
			}
		}
		return -1
	}
	reweigh := func(p *publisher.Publisher, w int) {
		t.Helper()
		in := p.Instance()
		in.Weight = w
		if err := p.Announce(t.Context(), in); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the new weight in the balancer", func() bool { return weightOf(in.InstanceID) == w })
	}
	share := func(n int) float64 {
		t.Helper()
		hits := 0
		for range n {
			if strings.HasPrefix(get(t, client, "http://orders/x"), "a ") {
				hits++
			}
		}
		return float64(hits) / float64(n)
	}

	if got := share(400); got < 0.4 || got > 0.6 {
		t.Fatalf("equal weights: a got %.2f of the traffic", got)
	}
	reweigh(a, 300)
	if got := share(400); got < 0.7 || got > 0.8 {
		t.Fatalf("weights 300 and 100: a got %.2f of the traffic, want 0.75", got)
	}
	reweigh(a, 0) // back to the default
	if got := share(400); got < 0.4 || got > 0.6 {
		t.Fatalf("back to equal weights: a got %.2f of the traffic", got)
	}
	if st := c.Stats(); st.Services[0].Servers != 2 {
		t.Fatalf("stats %+v", st.Services[0])
	}
}
