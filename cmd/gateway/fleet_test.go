package main

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// fleetView is the part of /-/fleet the test reads.
type fleetView struct {
	Gateways []struct {
		ID    string `json:"id"`
		Stale bool   `json:"stale"`
	} `json:"gateways"`
	Services []struct {
		Name     string `json:"name"`
		Revision uint64 `json:"revision"`
		Behind   []struct {
			Gateway  string `json:"gateway"`
			Revision uint64 `json:"revision"`
		} `json:"behind"`
	} `json:"services"`
}

// fleet reads the viewer's /-/fleet; the zero view while it cannot be
// read (the gateway starting).
func (g *gw) fleet(t *testing.T) fleetView {
	t.Helper()
	var v fleetView
	code, body, err := testutil.Fetch(client, "http://"+g.admin+"/-/fleet")
	if err != nil || code != 200 {
		return v
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/-/fleet: %v: %s", err, body)
	}
	return v
}

// behind returns the gateways the view lists behind on service.
func (v fleetView) behind(service string) []string {
	var out []string
	for _, sv := range v.Services {
		if sv.Name == service {
			for _, b := range sv.Behind {
				out = append(out, b.Gateway)
			}
		}
	}
	return out
}

// TestFleetViewShowsAPausedGateway: three gateway processes report what
// they applied (-report-id); one of them views the reports (-fleet-view).
// A gateway frozen by SIGSTOP is listed behind on the service whose
// change it did not apply, by the viewer, and no longer once it runs
// again and catches up.
func TestFleetViewShowsAPausedGateway(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	testpub.Announce(t, nc, "orders", "", testpub.Backend(t, "a"))
	gws := map[string]*gw{}
	for _, id := range []string{"gw-1", "gw-2", "gw-3"} {
		g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
		args := []string{"-nats", srv.URL(), "-listen", g.proxy, "-admin", g.admin, "-report-id", id, "-follow", "all"}
		if id == "gw-1" {
			args = append(args, "-fleet-view")
		}
		g.Proc = start(t, bin.gateway, args...)
		gws[id] = g
		if id == "gw-1" {
			// The viewer first: the others' first reports reach it (a
			// report missed is sent again only at the next heartbeat).
			g.waitHealthy(t)
		}
	}
	viewer := gws["gw-1"]
	testutil.Eventually(t, "three gateways in the view, none behind", func() bool {
		v := viewer.fleet(t)
		return len(v.Gateways) == 3 && len(v.Services) == 1 && len(v.behind("orders")) == 0
	})

	paused := gws["gw-3"]
	paused.Signal(t, syscall.SIGSTOP)
	testpub.Announce(t, nc, "orders", "", testpub.Backend(t, "b"))
	testutil.Eventually(t, "the paused gateway listed behind on orders", func() bool {
		return slices.Equal(viewer.fleet(t).behind("orders"), []string{"gw-3"})
	})
	req, _ := http.NewRequest("GET", "http://"+viewer.admin+"/-/fleet", nil)
	req.Header.Set("Accept", "text/html")
	if resp, err := client.Do(req); err != nil {
		t.Fatal(err)
	} else {
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(page), `<span class=behind>gw-3 at `) {
			t.Errorf("the fleet page does not show gw-3 behind:\n%s", page)
		}
	}

	paused.Signal(t, syscall.SIGCONT)
	testutil.Eventually(t, "the paused gateway caught up", func() bool { return len(viewer.fleet(t).behind("orders")) == 0 })
	for _, g := range viewer.fleet(t).Gateways {
		if g.Stale {
			t.Errorf("gateway %s listed stale", g.ID)
		}
	}
}
