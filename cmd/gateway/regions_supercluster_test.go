package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// multiregionExamples holds the shipped two-region NATS configurations
// (docs/multiregion.md, "Configs").
const multiregionExamples = "../../examples/nats-server/multiregion"

// superclusterWait bounds the waits of the supercluster test on
// JetStream: a fresh supercluster's meta group (both servers) elects its
// leader in seconds, and a stream or consumer is created through it.
const superclusterWait = 2 * time.Minute

// regionPrefix is region's subject prefix in a supercluster, where each
// region has a bucket of its own: region "eu" has "eu.lb", so bucket
// "pushlb_eu_lb".
func regionPrefix(region string) string { return region + ".lb" }

// superclusterGateway runs the gateway binary on region's server of the
// supercluster sc as docs/multiregion.md configures it there: the region's
// own prefix (so its own bucket), copying each region of remotes from that
// region's bucket through this server's JetStream (a bucket with no
// domain).
func superclusterGateway(t *testing.T, sc *natsproc.Supercluster, region string, remotes ...string) *gw {
	t.Helper()
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t)}
	args := []string{"-listen", g.proxy, "-admin", g.admin, "-nats", sc.URL(region), "-follow", "all",
		"-prefix", regionPrefix(region), "-region", region}
	for _, r := range remotes {
		args = append(args, "-remote-region", r+"=/pushlb_"+strings.ReplaceAll(regionPrefix(r), ".", "_"))
	}
	g.Proc = start(t, bin.gateway, args...)
	testutil.EventuallyWithin(t, superclusterWait, "the "+region+" gateway to be healthy", func() bool {
		select {
		case <-g.Done():
			t.Fatalf("the %s gateway exited:\n%s", region, g.Output())
		default:
		}
		code, _, err := testutil.Fetch(client, "http://"+g.admin+"/healthz")
		return err == nil && code == 200
	})
	return g
}

// eventTap records the regions of the events published on a region's
// server under its prefix's service subjects.
type eventTap struct {
	mu      sync.Mutex
	regions map[string]int // "" for an event without one
	sub     *nats.Subscription
}

func tapEvents(t *testing.T, sc *natsproc.Supercluster, region string) *eventTap {
	t.Helper()
	nc, err := nats.Connect(sc.URL(region))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	tap := &eventTap{regions: map[string]int{}}
	tap.sub, err = nc.Subscribe(regionPrefix(region)+".svc.>", func(m *nats.Msg) {
		var ev struct {
			Region string `json:"region"`
		}
		_ = json.Unmarshal(m.Data, &ev)
		tap.mu.Lock()
		tap.regions[ev.Region]++
		tap.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return tap
}

func (tap *eventTap) seen() map[string]int {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	out := map[string]int{}
	for k, v := range tap.regions {
		out[k] = v
	}
	return out
}

// TestRegionsInASupercluster: the supercluster variant of
// docs/multiregion.md, run from the example files
// (examples/nats-server/multiregion/gateway-*.conf, nats-server
// processes, clusters eu and us of one server each, joined by NATS
// gateways through a link the test cuts). Each region's gateway and
// announcers use the region's own prefix (eu.lb, us.lb), so each region
// has its own bucket, made by its gateway in its own cluster (JetStream's
// default placement: the cluster of the client that creates the stream);
// each gateway copies the other region's bucket through its own
// JetStream (-remote-region eu=/pushlb_eu_lb). Each gateway lists the
// other's instances as <id>@<region>; an instance withdrawn in eu leaves
// us's list; the events of one region never reach the other's gateway
// (its subjects are another prefix). The link cut: us routes its own
// instance with no failure, each region marks the other stale, eu's
// changes during the cut reach us after the heal.
func TestRegionsInASupercluster(t *testing.T) {
	began := time.Now()
	sc := natsproc.StartSupercluster(t, bin.natsServer, multiregionExamples)
	linked := time.Since(began)

	eu := superclusterGateway(t, sc, "eu", "us")
	us := superclusterGateway(t, sc, "us", "eu")
	healthy := time.Since(began)

	// Each bucket in its own region's cluster, though the gateways name
	// no placement.
	ctx := t.Context()
	jss := map[string]jetstream.JetStream{}
	for _, region := range natsproc.SuperclusterRegions {
		nc, err := nats.Connect(sc.URL(region), nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		jss[region] = js
		stream := "KV_pushlb_" + region + "_lb"
		var info *jetstream.StreamInfo
		testutil.EventuallyWithin(t, superclusterWait, stream+"'s info", func() bool {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			s, err := js.Stream(ctx, stream)
			if err != nil {
				return false
			}
			info = s.CachedInfo()
			return true
		})
		if info.Cluster == nil || info.Cluster.Name != region {
			t.Fatalf("%s placed in cluster %+v, want %s", stream, info.Cluster, region)
		}
		t.Logf("%s: cluster %s, leader %s, replicas %d", stream, info.Cluster.Name, info.Cluster.Leader, info.Config.Replicas)
	}

	taps := map[string]*eventTap{"eu": tapEvents(t, sc, "eu"), "us": tapEvents(t, sc, "us")}
	announceIn := func(region, id string, b *tracked) *testutil.Proc {
		return start(t, bin.announce, "-nats", sc.URL(region), "-prefix", regionPrefix(region), "-service", "orders",
			"-addr", b.addr(), "-id", id, "-region", region, "-drain", "0s")
	}
	listed := func(g *gw, want ...string) func() bool {
		return func() bool { return slices.Equal(g.ids(t), want) }
	}
	euB, eu2B, usB := newTracked(t, "eu-1"), newTracked(t, "eu-2"), newTracked(t, "us-1")
	announceIn("eu", "1", euB)
	eu2 := announceIn("eu", "2", eu2B)
	announceIn("us", "1", usB)
	testutil.EventuallyWithin(t, superclusterWait, "us to list eu's copies beside its own", listed(us, "1", "1@eu", "2@eu"))
	testutil.EventuallyWithin(t, superclusterWait, "eu to list us's copy beside its own", listed(eu, "1", "1@us", "2"))
	copied := time.Since(began)
	if seen := us.reached(t, "/orders/", 40); seen["us-1"] != 40 {
		t.Fatalf("us's requests went elsewhere while its own instance answered: %v", seen)
	}
	regionIs := func(g *gw, region string, stale bool) func() bool {
		return func() bool {
			v := g.regions(t)
			return len(v) == 1 && v[0].Region == region && v[0].Stale == stale
		}
	}
	testutil.EventuallyWithin(t, superclusterWait, "us to see eu linked", regionIs(us, "eu", false))
	testutil.EventuallyWithin(t, superclusterWait, "eu to see us linked", regionIs(eu, "us", false))

	// A withdrawal in eu leaves us's list.
	withdrawn := time.Now()
	eu2.Stop(t, exitTimeout)
	testutil.Eventually(t, "eu to drop its withdrawn instance", listed(eu, "1", "1@us"))
	testutil.Eventually(t, "us to drop eu's withdrawn instance", listed(us, "1", "1@eu"))
	withdrawal := time.Since(withdrawn)

	// Each region's events stay on its own subjects: each tap saw its
	// region's, and no gateway took (and dropped) another region's.
	for region, tap := range taps {
		seen := tap.seen()
		if seen[region] == 0 || len(seen) != 1 {
			t.Errorf("events on %s.svc.>: %v, want %s's alone", regionPrefix(region), seen, region)
		}
	}
	for region, g := range map[string]*gw{"eu": eu, "us": us} {
		if n := g.metric(`pushlb_events_dropped_total{reason="other_region"}`); n != 0 {
			t.Errorf("the %s gateway dropped %v events of another region", region, n)
		}
	}

	// The link cut: us keeps routing its own instance, each side marks
	// the other stale and keeps its copies; eu's changes made meanwhile
	// reach us after the heal.
	l := startLoad(us, loadWorkers)
	sc.Cut()
	cutAt := time.Now()
	testutil.EventuallyWithin(t, superclusterWait, "us to mark eu stale", regionIs(us, "eu", true))
	staleAfter := time.Since(cutAt)
	testutil.EventuallyWithin(t, superclusterWait, "eu to mark us stale", regionIs(eu, "us", true))
	eu3B := newTracked(t, "eu-3")
	announceIn("eu", "3", eu3B)
	testutil.EventuallyWithin(t, superclusterWait, "eu to list its new instance during the cut", listed(eu, "1", "1@us", "3"))
	if got := us.ids(t); !slices.Equal(got, []string{"1", "1@eu"}) {
		t.Fatalf("us's list changed during the cut: %v", got)
	}
	// The meta group spans both regions, one server each: neither side
	// can create a stream while they are apart.
	for region, js := range jss {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "cut_" + region})
		cancel()
		if err == nil {
			t.Errorf("%s created a bucket while cut off from the other region", region)
		}
	}
	l.waitMore(t, 100)
	healAt := time.Now()
	cutFor := healAt.Sub(cutAt)
	// When the meta group answers again after the heal (its leader
	// answers account info), noted beside the copies' return.
	metaBack := make(chan time.Duration, 1)
	metaCtx, stopMeta := context.WithCancel(ctx)
	var polling sync.WaitGroup
	defer func() {
		stopMeta()
		polling.Wait()
	}()
	polling.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			actx, cancel := context.WithTimeout(metaCtx, time.Second)
			_, err := jss["us"].AccountInfo(actx)
			cancel()
			if err == nil {
				metaBack <- time.Since(healAt)
				return
			}
			select {
			case <-metaCtx.Done():
				return
			case <-tick.C:
			}
		}
	})
	sc.Heal(t, superclusterWait)
	linkBack := time.Since(healAt)
	testutil.EventuallyWithin(t, superclusterWait, "us to list eu's new instance after the heal", listed(us, "1", "1@eu", "3@eu"))
	right := time.Since(healAt)
	testutil.EventuallyWithin(t, superclusterWait, "us to see eu linked again", regionIs(us, "eu", false))
	testutil.EventuallyWithin(t, superclusterWait, "eu to see us linked again", regionIs(eu, "us", false))
	unstale := time.Since(healAt)
	meta := testutil.Receive(t, metaBack, superclusterWait, "the meta group to answer again")
	l.stop()
	if n := l.failed.Load(); n != 0 {
		t.Errorf("%d of %d requests through us failed (first: %v)", n, l.sent.Load(), l.firstErr.Load())
	}
	if seen := eu3B.hits.Load() + euB.hits.Load(); seen != 0 {
		t.Errorf("eu's instances answered %d of us's requests while us's own answered", seen)
	}
	t.Logf("supercluster linked %v after the start; both gateways healthy (buckets made) %v; copies listed both ways %v; a withdrawal in eu left us's list %v after; cut: us marked eu stale %v after; heal after a cut of %v: the link carried traffic %v after (new gateway connections, once the pings gave the frozen ones up), us's list right %v after (%v after the link), both regions linked again %v after, the meta group answered (account info) %v after; load through us: %d requests, %d failed",
		linked.Round(time.Millisecond), healthy.Round(time.Millisecond), copied.Round(time.Millisecond), withdrawal.Round(time.Millisecond),
		staleAfter.Round(time.Millisecond), cutFor.Round(time.Millisecond), linkBack.Round(time.Millisecond), right.Round(time.Millisecond), (right - linkBack).Round(time.Millisecond),
		unstale.Round(time.Millisecond), meta.Round(time.Millisecond),
		l.sent.Load(), l.failed.Load())
}
