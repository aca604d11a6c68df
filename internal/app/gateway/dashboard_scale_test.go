package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"

	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// Payload budgets of the dashboard with many services: the whole state
// grows with the instances, within these bounds per instance; an update
// for one change does not grow with the number of services.
const (
	maxSnapshotPerInstance = 700  // bytes of the indented /-/lb JSON per instance
	maxStatePerInstance    = 450  // bytes of the stream's first "state" event per instance
	maxDeltaBytes          = 4096 // bytes of the "update" event for one instance leaving
)

// loadFleet registers services x instances in the gateway's registry (and
// publishes their online events), as that many announcers would, and waits
// until the gateway balances all of them and its dashboard has pushed every
// resulting change.
func loadFleet(t *testing.T, g *Gateway, services, instances int) (*scale.Fleet, *nats.Conn, []serverlist.Instance) {
	t.Helper()
	nc, err := nats.Connect(g.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f, ins, err := scale.Load(t.Context(), nc, scale.Size{Services: services, Instances: instances, Gateways: 1}, g.cfg.Lease, 1)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "every instance in the gateway", func() bool {
		names := g.client.Services()
		if len(names) != services {
			return false
		}
		for _, n := range names {
			if st, ok := g.client.ServiceStats(n); !ok || st.Servers != instances {
				return false
			}
		}
		return true
	})
	testutil.Eventually(t, "the dashboard to have pushed every change", func() bool {
		g.dash.mu.Lock()
		defer g.dash.mu.Unlock()
		return len(g.dash.dirty) == 0 && g.dash.sentSeq == g.dash.seq
	})
	return f, nc, ins
}

// With 1,000 services of 3 instances, the snapshot and the stream's first
// state stay within a budget per instance, and one instance leaving pushes
// an update of that service alone, not the whole state.
func TestDashboardWithThousandServices(t *testing.T) {
	const services, instances = 1000, 3
	g := startGateway(t, testConfig(t))
	f, nc, ins := loadFleet(t, g, services, instances)
	total := services * instances

	_, snapshot := testutil.Get(t, "http://"+g.AdminAddr()+"/-/lb")
	var st struct{ Services []ServiceState }
	if err := json.Unmarshal([]byte(snapshot), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Services) != services {
		t.Fatalf("/-/lb: %d services, want %d", len(st.Services), services)
	}
	ch, _ := openStream(t, g)
	state := nextEvent(t, ch, "state", nil)
	t.Logf("%d services x %d instances: /-/lb JSON %d bytes (%d per instance), stream's first state %d bytes (%d per instance), page %d bytes",
		services, instances, len(snapshot), len(snapshot)/total, len(state), len(state)/total, len(dashboardHTML))
	if len(snapshot) > maxSnapshotPerInstance*total {
		t.Errorf("/-/lb: %d bytes, over the budget of %d per instance", len(snapshot), maxSnapshotPerInstance)
	}
	if len(state) > maxStatePerInstance*total {
		t.Errorf("first state: %d bytes, over the budget of %d per instance", len(state), maxStatePerInstance)
	}

	gone := ins[500*instances] // instance 0 of svc-500
	if err := f.Deregister(t.Context(), nc, gone); err != nil {
		t.Fatal(err)
	}
	var u update
	data := nextEvent(t, ch, "update", func(data string) bool {
		u = update{}
		json.Unmarshal([]byte(data), &u)
		for _, s := range u.Services {
			if s.Name == gone.Service && len(s.Servers) == instances-1 {
				return true
			}
		}
		return false
	})
	t.Logf("one instance leaving: an update of %d bytes (%d services, %d changes)", len(data), len(u.Services), len(u.Changes))
	if len(u.Services) != 1 || len(u.Removed) != 0 || len(u.Changes) != 1 || u.Changes[0].Instance != gone.InstanceID {
		t.Errorf("update for one instance leaving: %d services, removed %v, changes %+v", len(u.Services), u.Removed, u.Changes)
	}
	if len(data) > maxDeltaBytes {
		t.Errorf("update for one instance leaving: %d bytes, over %d", len(data), maxDeltaBytes)
	}
}

// Under traffic on every one of 1,000 services, the stats checks do not
// resend the whole state: each update carries at most maxStatsServers'
// worth of busy services, and they take turns until every one was sent.
func TestDashboardStatsTakeTurns(t *testing.T) {
	const services, instances, perCheck = 1000, 3, 600 // 200 services per check
	g, err := New(testConfig(t), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	g.dash.statsEvery, g.dash.statsMax = 50*time.Millisecond, perCheck // before the loop starts
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	loadFleet(t, g, services, instances)
	ch, _ := openStream(t, g)
	nextEvent(t, ch, "state", nil)

	// One request on every service, through its balancer.
	for _, name := range g.client.Services() {
		b, err := g.client.Balancer(name)
		if err != nil {
			t.Fatal(err)
		}
		pick, err := b.Pick(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		pick.Done(balancer.DoneInfo{})
	}
	sent := map[string]bool{}
	updates, largest := 0, 0
	for len(sent) < services {
		data := nextEvent(t, ch, "update", nil)
		var u struct{ Services []ServiceState }
		if err := json.Unmarshal([]byte(data), &u); err != nil {
			t.Fatal(err)
		}
		updates++
		largest = max(largest, len(data))
		if len(u.Services) > perCheck/instances {
			t.Fatalf("update %d: %d services, over the %d of one check", updates, len(u.Services), perCheck/instances)
		}
		for _, s := range u.Services {
			var requests int64
			for _, srv := range s.Servers {
				requests += srv.Requests
			}
			if requests == 1 {
				sent[s.Name] = true
			}
		}
	}
	t.Logf("1,000 busy services sent in %d updates of at most %d bytes (the whole state: %d services)", updates, largest, services)
	if updates < services*instances/perCheck {
		t.Errorf("%d updates, want at least %d", updates, services*instances/perCheck)
	}
	if largest > perCheck*maxStatePerInstance+maxDeltaBytes {
		t.Errorf("an update of %d bytes, over %d", largest, perCheck*maxStatePerInstance+maxDeltaBytes)
	}
}

// maxSummaryPerService bounds the bytes of the stream's first state per
// service on a gateway beyond summarizeOver instances, whatever its
// instances; maxStateOverhead is the timeline and counters on top.
const (
	maxSummaryPerService = 400
	maxStateOverhead     = 64 << 10
)

// summarized is the stream's state or update, with its summaries.
type summarized struct {
	Services  []ServiceState
	Summaries []ServiceSummary
	Removed   []string
	Changes   []TimelineEntry
}

// fetchService reads /-/lb/service?name=.
func fetchService(t *testing.T, g *Gateway, name string) (ServiceState, int) {
	t.Helper()
	code, body := testutil.Get(t, "http://"+g.AdminAddr()+"/-/lb/service?name="+url.QueryEscape(name))
	var ss ServiceState
	if code == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &ss); err != nil {
			t.Fatal(err)
		}
	}
	return ss, len(body)
}

// With 1,000 services of 6 instances (over summarizeOver), the stream's
// first state carries a summary per service, bounded per service and not
// per instance; an instance leaving an unopened service sends that
// service's summary alone; /-/lb/service has the service's instances.
func TestDashboardSummariesOnBigGateway(t *testing.T) {
	const services, instances = 1000, 6
	if services*instances <= summarizeOver {
		t.Fatalf("%d instances: not over summarizeOver (%d)", services*instances, summarizeOver)
	}
	g := startGateway(t, testConfig(t))
	f, nc, ins := loadFleet(t, g, services, instances)
	ch, _ := openStream(t, g)
	data := nextEvent(t, ch, "state", nil)
	var st summarized
	if err := json.Unmarshal([]byte(data), &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d services x %d instances: first state %d bytes (%d per service)", services, instances, len(data), len(data)/services)
	if len(st.Services) != 0 || len(st.Summaries) != services {
		t.Fatalf("first state: %d services, %d summaries, want 0 and %d", len(st.Services), len(st.Summaries), services)
	}
	if s := st.Summaries[0]; s.Instances != instances || s.Up != instances || s.Tripped != 0 || len(s.Zones) == 0 || s.Rule == "" {
		t.Errorf("summary: %+v", s)
	}
	if len(data) > maxSummaryPerService*services+maxStateOverhead {
		t.Errorf("first state: %d bytes, over %d per service", len(data), maxSummaryPerService)
	}

	gone := ins[500*instances] // instance 0 of svc-500
	if err := f.Deregister(t.Context(), nc, gone); err != nil {
		t.Fatal(err)
	}
	var u summarized
	data = nextEvent(t, ch, "update", func(data string) bool {
		u = summarized{}
		json.Unmarshal([]byte(data), &u)
		for _, s := range u.Summaries {
			if s.Name == gone.Service && s.Instances == instances-1 {
				return true
			}
		}
		return false
	})
	t.Logf("one instance leaving: an update of %d bytes", len(data))
	if len(u.Services) != 0 || len(u.Summaries) != 1 || len(u.Removed) != 0 || len(u.Changes) != 1 || u.Changes[0].Instance != gone.InstanceID {
		t.Errorf("update for one instance leaving: %d services, %d summaries, removed %v, changes %+v", len(u.Services), len(u.Summaries), u.Removed, u.Changes)
	}
	if len(data) > maxDeltaBytes {
		t.Errorf("update for one instance leaving: %d bytes, over %d", len(data), maxDeltaBytes)
	}

	ss, n := fetchService(t, g, gone.Service)
	t.Logf("/-/lb/service?name=%s: %d bytes", gone.Service, n)
	if ss.Name != gone.Service || len(ss.Servers) != instances-1 {
		t.Fatalf("/-/lb/service: %s with %d servers, want %s with %d", ss.Name, len(ss.Servers), gone.Service, instances-1)
	}
	for _, s := range ss.Servers {
		if s.ID == gone.InstanceID || s.Status != "up" || s.Addr == "" {
			t.Errorf("/-/lb/service: server %+v", s)
		}
	}
	if code, _ := testutil.Get(t, "http://"+g.AdminAddr()+"/-/lb/service?name=nope"); code != http.StatusNotFound {
		t.Errorf("/-/lb/service for no service: %d, want 404", code)
	}
	if code, body := testutil.Get(t, "http://"+g.AdminAddr()+"/-/lb/service"); code != http.StatusBadRequest || !strings.Contains(body, "usage") {
		t.Errorf("/-/lb/service without a name: %d %q, want 400 with the usage", code, body)
	}
}

// At the fleet size this project targets, 1,000 services of 100 instances,
// the first state in full and in summaries, and one service's detail:
// figures for docs/config.md. It loads 100,000 instances: run it with
// PUSHLB_DASHBOARD_FLEET=1.
func TestDashboardFirstStateAtFleetSize(t *testing.T) {
	if os.Getenv("PUSHLB_DASHBOARD_FLEET") == "" {
		t.Skip("set PUSHLB_DASHBOARD_FLEET=1 to load 1,000 services x 100 instances")
	}
	const services, instances = 1000, 100
	g := startGateway(t, testConfig(t))
	loadFleet(t, g, services, instances)

	start := time.Now()
	full := sseMessage("state", streamState{State: g.State()})
	fullTook := time.Since(start)
	start = time.Now()
	ch, _ := openStream(t, g)
	data := nextEvent(t, ch, "state", nil)
	took := time.Since(start)
	start = time.Now()
	ss, n := fetchService(t, g, "svc-500")
	detailTook := time.Since(start)
	t.Logf("%d services x %d instances: the first state in full %d bytes (read and encoded in %v), in summaries %d bytes (%d per service, received in %v); /-/lb/service?name=svc-500 %d bytes (%d servers) in %v",
		services, instances, len(full), fullTook.Round(time.Millisecond), len(data), len(data)/services, took.Round(time.Millisecond), n, len(ss.Servers), detailTook.Round(time.Microsecond))
	if len(data) > maxSummaryPerService*services+maxStateOverhead || len(ss.Servers) != instances {
		t.Errorf("first state %d bytes, detail %d servers", len(data), len(ss.Servers))
	}
}
