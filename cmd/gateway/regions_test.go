package main

import (
	"encoding/json"
	"maps"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestRegionFailover: a gateway in region eu (regionPriority: [us]) over
// instances announced in eu, us and ap (announce -region). Requests go to
// eu's instance; when it leaves (announced offline), to us's; when that
// one crashes (SIGKILL of its announce and its backend closed), to ap's;
// when eu's is announced again, back to eu. Under a steady load, with the
// gateway's retries, no request fails. It logs how long each move took
// after the change, as the requests saw it.
func TestRegionFailover(t *testing.T) {
	g := startConfigured(t, "region: eu\nregionPriority: [us]\n")
	backends := map[string]*httptest.Server{}
	anns := map[string]*testutil.Proc{}
	for _, name := range []string{"eu", "us", "ap"} {
		backends[name] = named(t, name)
		anns[name] = announceHold(t, g, "orders", backends[name].Listener.Addr().String(), "-region", name, "-id", name)
	}
	testutil.Eventually(t, "three regions listed", func() bool { return strings.Count(g.state(t), `"id"`) == 3 })
	if st := g.state(t); !strings.Contains(st, `"region": "us"`) {
		t.Errorf("/-/lb does not show the instances' regions: %s", st)
	}
	if seen := g.reached(t, "/orders/", 50); !maps.Equal(seen, map[string]int{"eu": 50}) {
		t.Fatalf("before any change: %v, want eu alone", seen)
	}

	// A steady load, noting when each region first answered and what
	// failed.
	var (
		mu       sync.Mutex
		first    = map[string]time.Time{}
		failed   atomic.Int64
		requests atomic.Int64
		stop     = make(chan struct{})
		done     sync.WaitGroup
	)
	for range 4 {
		done.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, body, err := g.hit("/orders/")
				requests.Add(1)
				if err != nil || code != 200 {
					failed.Add(1)
					continue
				}
				mu.Lock()
				if _, ok := first[body]; !ok {
					first[body] = time.Now()
				}
				mu.Unlock()
			}
		})
	}
	answered := func(region string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := first[region]
			return ok
		}
	}
	since := func(region string, at time.Time) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return first[region].Sub(at).Round(time.Millisecond)
	}

	at := time.Now()
	if code := anns["eu"].Stop(t, exitTimeout); code != 0 {
		t.Fatalf("announce eu exited %d", code)
	}
	testutil.Eventually(t, "us to answer", answered("us"))
	tookUS := since("us", at)

	at = time.Now()
	anns["us"].Kill(t)
	backends["us"].Close()
	testutil.Eventually(t, "ap to answer", answered("ap"))
	tookAP := since("ap", at)

	mu.Lock()
	delete(first, "eu")
	mu.Unlock()
	at = time.Now()
	anns["eu"] = announceHold(t, g, "orders", backends["eu"].Listener.Addr().String(), "-region", "eu", "-id", "eu")
	testutil.Eventually(t, "eu to answer again", answered("eu"))
	back := since("eu", at)
	close(stop)
	done.Wait()

	if seen := g.reached(t, "/orders/", 50); !maps.Equal(seen, map[string]int{"eu": 50}) {
		t.Fatalf("eu back: %v, want eu alone", seen)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed", n, requests.Load())
	}
	mu.Lock()
	regions := slices.Sorted(maps.Keys(first))
	mu.Unlock()
	t.Logf("regions answered: %v; eu offline → us answered %v after; us crashed → ap %v after; eu announced again → eu %v after its start; %d requests, %d failed",
		regions, tookUS, tookAP, back, requests.Load(), failed.Load())
}

// regionGateway runs the gateway binary on region name's NATS server, in
// that region, copying the records of the regions remotes.
func regionGateway(t *testing.T, rs *natstest.Regions, name string, remotes ...string) *gw {
	t.Helper()
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	args := []string{"-listen", g.proxy, "-admin", g.admin, "-nats", rs.URL(name), "-follow", "all", "-region", name}
	for _, r := range remotes {
		args = append(args, "-remote-region", r)
	}
	g.Proc = start(t, bin.gateway, args...)
	g.waitHealthy(t)
	return g
}

// regionView is one region of /-/lb's "regions".
type regionView struct {
	Region string `json:"region"`
	Linked bool   `json:"linked"`
	Stale  bool   `json:"stale"`
	Copies int    `json:"copies"`
}

// regions returns /-/lb's "regions", nil when it cannot be read.
func (g *gw) regions(t testing.TB) []regionView {
	var st struct {
		Regions []regionView `json:"regions"`
	}
	if json.Unmarshal([]byte(g.state(t)), &st) != nil {
		return nil
	}
	return st.Regions
}

// TestRegionsAcrossALeafLink: two regions, each its own NATS server and
// JetStream domain (eu the hub, us a leaf node of it, with the gateway's
// accounts), a gateway in each (-region, -remote-region the other) and
// instances announced in each region to its own server (announce
// -region). Each gateway lists the other region's instances by their
// qualified IDs and routes to its own; us's requests go to eu when us's
// last instance leaves, and back when it returns. A crash in eu leaves
// us's list only when eu's registry removes the record (the advisory
// stays regional). The link cut: both gateways route their own
// instances, no request fails, /-/lb marks the other region stale; eu's
// changes during the cut reach us after the heal.
func TestRegionsAcrossALeafLink(t *testing.T) {
	rs := natstest.StartRegionsWith(t, []natstest.Option{natstest.WithAdvisories(t, "lb")}, "eu", "us")
	eu := regionGateway(t, rs, "eu", "us")
	us := regionGateway(t, rs, "us", "eu")
	announceIn := func(region, id string, b *tracked) *testutil.Proc {
		return start(t, bin.announce, "-nats", rs.URL(region), "-service", "orders", "-addr", b.addr(), "-id", id, "-region", region, "-drain", "0s")
	}
	euB, us1B, us2B := newTracked(t, "eu-1"), newTracked(t, "us-1"), newTracked(t, "us-2")
	euA := announceIn("eu", "1", euB)
	us1 := announceIn("us", "1", us1B)
	listed := func(g *gw, want ...string) func() bool {
		return func() bool { return slices.Equal(g.ids(t), want) }
	}
	testutil.Eventually(t, "us to list eu's copy beside its own", listed(us, "1", "1@eu"))
	testutil.Eventually(t, "eu to list us's copy beside its own", listed(eu, "1", "1@us"))
	if seen := us.reached(t, "/orders/", 40); seen["eu-1"] != 0 {
		t.Fatalf("us sent requests to eu while its own answered: %v", seen)
	}
	linked := func(g *gw, region string, stale bool) func() bool {
		return func() bool {
			v := g.regions(t)
			return len(v) == 1 && v[0].Region == region && v[0].Stale == stale
		}
	}
	testutil.Eventually(t, "us to see eu linked", linked(us, "eu", false))

	l := startLoad(us, loadWorkers)
	// us's last instance leaves: us's requests go to eu's; a new one in
	// us takes them back.
	left := time.Now()
	us1.Stop(t, exitTimeout)
	testutil.Eventually(t, "eu's instance to answer us's requests", func() bool { return euB.hits.Load() > 0 })
	toEU := time.Unix(0, euB.first.Load()).Sub(left)
	announceIn("us", "2", us2B)
	testutil.Eventually(t, "us's new instance to answer", func() bool { return us2B.hits.Load() > 0 })
	testutil.Eventually(t, "us to route to its own again", func() bool {
		before := euB.hits.Load()
		us.reached(t, "/orders/", 20)
		return euB.hits.Load() == before
	})

	// A crash in eu: eu's gateway learns it from its advisory, us from
	// eu's registry, once eu's reaper released the record.
	euA.Kill(t)
	euB.Close()
	testutil.Eventually(t, "eu to drop its crashed instance", listed(eu, "2@us"))
	testutil.Eventually(t, "us to drop eu's crashed instance (its record removed in eu)", listed(us, "2"))

	// The link cut: us keeps routing its own instance.
	rs.Cut(t, "us")
	cutAt := time.Now()
	testutil.EventuallyWithin(t, 30*time.Second, "us to mark eu stale", linked(us, "eu", true))
	staleAfter := time.Since(cutAt)
	euB2 := newTracked(t, "eu-3")
	announceIn("eu", "3", euB2)
	testutil.Eventually(t, "eu to list its new instance", listed(eu, "2@us", "3"))
	if !slices.Equal(us.ids(t), []string{"2"}) {
		t.Fatalf("us's list changed during the cut: %v", us.ids(t))
	}
	healAt := time.Now()
	rs.Heal(t, "us")
	linkBack := time.Since(healAt)
	testutil.Eventually(t, "us to list eu's new instance after the heal", listed(us, "2", "3@eu"))
	right := time.Since(healAt)
	testutil.Eventually(t, "us to see eu linked again", linked(us, "eu", false))
	l.stop()
	if n := l.failed.Load(); n != 0 {
		t.Errorf("%d of %d requests through us failed (first: %v)", n, l.sent.Load(), l.firstErr.Load())
	}
	t.Logf("us's last instance left: eu answered %v after; link cut: us marked eu stale %v after the cut; the link carried traffic %v after the heal, us's list right %v after it; load: %d requests, %d failed",
		toEU.Round(time.Millisecond), staleAfter.Round(time.Millisecond), linkBack.Round(time.Millisecond), right.Round(time.Millisecond), l.sent.Load(), l.failed.Load())
}

// TestRegionAddedAndRemoved: three regions (eu the hub, us and ap leaf
// nodes of it); us's gateway copies eu's records, then, restarted with ap
// added, ap's too (a leaf region read through the hub), then, restarted
// without eu, removes eu's copies and its status.
func TestRegionAddedAndRemoved(t *testing.T) {
	rs := natstest.StartRegions(t, "eu", "us", "ap")
	for _, region := range []string{"eu", "ap", "us"} {
		b := newTracked(t, region)
		start(t, bin.announce, "-nats", rs.URL(region), "-service", "orders", "-addr", b.addr(), "-id", "1", "-region", region, "-drain", "0s")
	}
	listed := func(g *gw, want ...string) func() bool {
		return func() bool { return slices.Equal(g.ids(t), want) }
	}
	names := func(g *gw) []string {
		var out []string
		for _, r := range g.regions(t) {
			out = append(out, r.Region)
		}
		return out
	}
	us := regionGateway(t, rs, "us", "eu")
	testutil.Eventually(t, "eu's instance copied", listed(us, "1", "1@eu"))
	us.Stop(t, exitTimeout)

	us = regionGateway(t, rs, "us", "eu", "ap")
	testutil.Eventually(t, "ap's instance copied too", listed(us, "1", "1@ap", "1@eu"))
	testutil.Eventually(t, "both regions shown", func() bool { return slices.Equal(names(us), []string{"ap", "eu"}) })
	us.Stop(t, exitTimeout)

	us = regionGateway(t, rs, "us", "ap")
	testutil.Eventually(t, "eu's copy removed", listed(us, "1", "1@ap"))
	testutil.Eventually(t, "eu's status removed", func() bool { return slices.Equal(names(us), []string{"ap"}) })
}
