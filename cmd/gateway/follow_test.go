package main

import (
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestDefaultFollowsOnRequest runs the gateway as a user starts it, with
// no -follow and no subscriber.services: it follows what it is asked for.
// The first request for orders is routed to its instance; billing, in the
// registry but never asked for, gets no balancer.
func TestDefaultFollowsOnRequest(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	testpub.Announce(t, nc, "billing", "", testpub.Backend(t, "billing-1"))
	testpub.Announce(t, nc, "orders", "", testpub.Backend(t, "orders-1"))

	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-nats", srv.URL(), "-listen", g.proxy, "-admin", g.admin)
	testutil.Eventually(t, "the gateway to be ready", func() bool { return g.metric("pushlb_nats_connected") == 1 })

	code, body, err := g.hit("/orders/x")
	if err != nil || code != 200 || !strings.HasPrefix(body, "orders-1") {
		t.Fatalf("first request for orders: %d %q %v; want 200 from orders-1", code, body, err)
	}
	if got := g.metric(`pushlb_follows_total{result="followed"}`); got != 1 {
		t.Errorf("follows: %v, want 1", got)
	}
	if got := g.metric("pushlb_followed_services"); got != 1 {
		t.Errorf("followed services: %v, want 1 (orders)", got)
	}
	if state := g.state(t); !strings.Contains(state, "orders-1") && !strings.Contains(state, `"orders"`) || strings.Contains(state, "billing") {
		t.Errorf("/-/lb lists orders only? %s", state)
	}
}
