package pushlbk8s_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbk8s "github.com/pushlb/pushlb/k8s"
	"github.com/pushlb/pushlb/k8s/internal/testenv"
	"github.com/pushlb/pushlb/serverlist"
)

// TestBridge runs the bridge against one real control plane (etcd and
// kube-apiserver processes), an in-process NATS server per subtest and a
// real gateway (pushlb client). The API server's restart runs last.
func TestBridge(t *testing.T) {
	env := testenv.Start(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *testenv.Env)
	}{
		{"Conditions", testConditions},
		{"SplitAndMerge", testSplitAndMerge},
		{"ServiceDeletedAndSelector", testServiceDeletedAndSelector},
		{"ForeignRecords", testForeignRecords},
		{"Malformed", testMalformed},
		{"PodLabels", testPodLabels},
		{"Renewal", testRenewal},
		{"HandOver", testHandOver},
		{"Manifests", testManifests},
		{"CommandCrash", testCommandCrash},
		{"NATSPermissions", testNATSPermissions},
		{"APIServerRestart", testAPIServerRestart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Registered first, so it runs after every other cleanup
			// (bridges, gateway, NATS server).
			t.Cleanup(func() { goleak.VerifyNone(t, leakOptions()...) })
			tc.run(t, env)
		})
	}
}

// testConditions: ready is listed with its zone, not ready is not,
// serving+terminating drains (offline, record kept down), gone withdraws.
func testConditions(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	h.service("web", nil)
	h.putSlice("web-1", "web",
		readyEP("a", "10.1.0.1", "z1"),
		ep{pod: "b", ip: "10.1.0.2", zone: "z1"}, // not ready, not serving
		readyEP("c", "10.1.0.3", "z2"))
	b := h.startBridge(pushlbk8s.Config{})
	h.waitListed("a", "c")

	recs := h.records()
	if len(recs) != 2 || recs[h.id("a")].Zone != "z1" || recs[h.id("c")].Zone != "z2" {
		t.Fatalf("records: %+v", recs)
	}
	a := recs[h.id("a")]
	if a.Host != "10.1.0.1" || a.Port != 8080 || a.Owner != pushlbk8s.DefaultOwner || a.Metadata[pushlbk8s.MetaService] != h.ns+"/web" {
		t.Fatalf("record of a: %+v", a)
	}
	gb, _ := h.gw.Balancer("web")
	for _, s := range gb.Servers() {
		if want := map[string]string{h.id("a"): "z1", h.id("c"): "z2"}[s.ID]; s.Zone != want {
			t.Errorf("gateway: %s in zone %q, want %q", s.ID, s.Zone, want)
		}
	}
	// The gateway may list a record before the bridge has its write's ack.
	writes := waitStats(t, b, "two writes counted", func(s pushlbk8s.Stats) bool { return s.Writes >= 2 }).Writes
	if writes != 2 {
		t.Errorf("%d registry writes for 2 ready endpoints, want 2", writes)
	}

	// c terminates while it still serves: drained, its record kept down.
	offline := h.offline.Load()
	h.putSlice("web-1", "web",
		readyEP("a", "10.1.0.1", "z1"),
		ep{pod: "b", ip: "10.1.0.2", zone: "z1"},
		ep{pod: "c", ip: "10.1.0.3", zone: "z2", serving: true, terminating: true})
	h.waitListed("a")
	// The gateway may act on the event before this test's connection
	// receives it.
	testutil.Eventually(t, "the drain's offline event", func() bool { return h.offline.Load() > offline })
	// The record is marked down after the event (the gateways stop first),
	// and a listing made while that write lands may miss it: wait for it.
	testutil.Eventually(t, "drained c's record kept and marked down", func() bool {
		c, ok := h.records()[h.id("c")]
		return ok && !c.Routable()
	})

	// b becomes ready; c is gone: b listed, c's record removed.
	h.putSlice("web-1", "web", readyEP("a", "10.1.0.1", "z1"), readyEP("b", "10.1.0.2", "z1"))
	h.waitListed("a", "b")
	testutil.Eventually(t, "c's record removed", func() bool { _, ok := h.records()[h.id("c")]; return !ok })
	// a, c created; c drained; b created, c removed: one write per change.
	if s := waitStats(t, b, "five writes counted", func(s pushlbk8s.Stats) bool { return s.Writes >= 5 }); s.Writes != 5 || s.Malformed != 0 || s.Foreign != 0 {
		t.Errorf("stats %+v: want 5 writes (one per endpoint change), nothing malformed or foreign", s)
	}

	// Everything not ready: nothing listed, nothing left.
	h.putSlice("web-1", "web", ep{pod: "a", ip: "10.1.0.1"}, ep{pod: "b", ip: "10.1.0.2"})
	h.waitListed()
	testutil.Eventually(t, "registry empty", func() bool { return len(h.records()) == 0 })
}

// testSplitAndMerge: endpoints that move between slices (the controller
// splits a full slice, or merges two) are never withdrawn.
func testSplitAndMerge(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	h.service("web", nil)
	all := []ep{readyEP("a", "10.2.0.1", ""), readyEP("b", "10.2.0.2", ""), readyEP("c", "10.2.0.3", ""), readyEP("d", "10.2.0.4", "")}
	h.putSlice("web-1", "web", all...)
	b := h.startBridge(pushlbk8s.Config{})
	h.waitListed("a", "b", "c", "d")
	writes := waitStats(t, b, "four writes counted", func(s pushlbk8s.Stats) bool { return s.Writes >= 4 }).Writes

	// Split: c and d move to web-2 (created first, as the controller
	// creates before it trims), and a new endpoint e lands in web-1 with
	// the trim: once e's online event is in, every earlier event is.
	online := h.online.Load()
	h.putSlice("web-2", "web", all[2:]...)
	h.putSlice("web-1", "web", all[0], all[1], readyEP("e", "10.2.0.5", ""))
	testutil.Eventually(t, "e announced", func() bool { return h.online.Load() > online })
	h.waitListed("a", "b", "c", "d", "e")
	if n := h.offline.Load(); n != 0 {
		t.Fatalf("%d offline events during the split, want 0", n)
	}
	if got := b.Stats().Writes - writes; got != 1 {
		t.Errorf("%d registry writes for the split (one endpoint added), want 1", got)
	}

	// Merge: web-1 takes everything back, web-2 is deleted, and f appears.
	writes, online = b.Stats().Writes, h.online.Load()
	h.putSlice("web-1", "web", append(all, readyEP("e", "10.2.0.5", ""), readyEP("f", "10.2.0.6", ""))...)
	h.deleteSlice("web-2")
	testutil.Eventually(t, "f announced", func() bool { return h.online.Load() > online })
	h.waitListed("a", "b", "c", "d", "e", "f")
	if n := h.offline.Load(); n != 0 {
		t.Fatalf("%d offline events during the merge, want 0", n)
	}
	if got := b.Stats().Writes - writes; got != 1 {
		t.Errorf("%d registry writes for the merge (one endpoint added), want 1", got)
	}
}

// testServiceDeletedAndSelector: a Service deleted, or no longer selected,
// withdraws its endpoints; selected again, they come back.
func testServiceDeletedAndSelector(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.3.0.1", ""), readyEP("b", "10.3.0.2", ""))
	h.startBridge(pushlbk8s.Config{})
	h.waitListed("a", "b")

	svcs := h.kube.CoreV1().Services(h.ns)
	svc, err := svcs.Get(t.Context(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Labels = map[string]string{"pushlb.io/bridge": "false"}
	if svc, err = svcs.Update(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitListed()
	testutil.Eventually(t, "registry empty once unselected", func() bool { return len(h.records()) == 0 })

	svc.Labels = map[string]string{"pushlb.io/bridge": "true"}
	if _, err = svcs.Update(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitListed("a", "b")

	if err := svcs.Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitListed()
	testutil.Eventually(t, "registry empty once deleted", func() bool { return len(h.records()) == 0 })
}

// testForeignRecords: records announce wrote (another owner) are never
// overwritten or removed, even under an ID the bridge would use.
func testForeignRecords(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	announced := serverlist.Instance{Service: "web", InstanceID: "10.9.9.9:web:8080", Host: "10.9.9.9", Port: 8080, Owner: "announce-xyz", Incarnation: 1}
	clash := serverlist.Instance{Service: "web", InstanceID: h.id("b"), Host: "10.9.9.8", Port: 8080, Owner: "announce-abc", Incarnation: 1}
	for _, in := range []serverlist.Instance{announced, clash} {
		if _, err := h.reg.Register(t.Context(), in); err != nil {
			t.Fatal(err)
		}
	}
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.4.0.1", ""), readyEP("b", "10.4.0.2", ""))
	b := h.startBridge(pushlbk8s.Config{})
	waitStats(t, b, "the clash counted", func(s pushlbk8s.Stats) bool { return s.Foreign >= 1 })
	testutil.Eventually(t, "a listed beside the announced ones", func() bool {
		l := h.listed()
		return len(l) == 3
	})
	recs := h.records()
	if got := recs[h.id("b")]; got.Owner != "announce-abc" || got.Host != "10.9.9.8" {
		t.Fatalf("the bridge overwrote announce's record: %+v", got)
	}
	// The bridge's endpoints go: announce's records stay.
	h.putSlice("web-1", "web")
	testutil.Eventually(t, "a withdrawn", func() bool { _, ok := h.records()[h.id("a")]; return !ok })
	recs = h.records()
	if _, ok := recs[announced.InstanceID]; !ok {
		t.Fatal("the bridge removed announce's record")
	}
	if got := recs[h.id("b")]; got.Owner != "announce-abc" {
		t.Fatalf("the bridge removed or overwrote announce's record under its ID: %+v", got)
	}
}

// testMalformed: a slice without ports, a port without a number, a Service
// of several ports without the port annotation, an invalid service name:
// logged, counted, skipped; the rest is bridged.
func testMalformed(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	h.service("web", nil)
	h.service("two-ports", nil,
		corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
		corev1.ServicePort{Name: "grpc", Port: 90, TargetPort: intstr.FromInt32(9090)})
	h.service("bad-name", map[string]string{pushlbk8s.AnnotationService: "has.dots"})
	h.putSliceWith("web-noports", "web", discoveryv1.AddressTypeIPv4, nil, readyEP("x", "10.5.0.9", ""))
	h.putSliceWith("web-nonumber", "web", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: ptr("http")}}, readyEP("y", "10.5.0.8", ""))
	h.putSlice("two-ports-1", "two-ports", readyEP("p", "10.5.1.1", ""))
	h.putSlice("bad-name-1", "bad-name", readyEP("q", "10.5.2.1", ""))
	h.putSlice("web-1", "web", readyEP("a", "10.5.0.1", ""))
	b := h.startBridge(pushlbk8s.Config{})
	h.waitListed("a")
	waitStats(t, b, "four malformed objects counted", func(s pushlbk8s.Stats) bool { return s.Malformed >= 4 })
	if recs := h.records(); len(recs) != 1 {
		t.Fatalf("records %v, want only a", recs)
	}
}

// testPodLabels: chosen pod labels reach the record's metadata, and a
// label change is written.
func testPodLabels(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	pods := h.kube.CoreV1().Pods(h.ns)
	pod, err := pods.Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"version": "v1", "secret": "s"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.6.0.1", ""))
	h.startBridge(pushlbk8s.Config{PodLabels: []string{"version"}})
	h.waitListed("a")
	meta := func() map[string]string { return h.records()[h.id("a")].Metadata }
	testutil.Eventually(t, "version v1 in the record", func() bool { return meta()["version"] == "v1" })
	if _, ok := meta()["secret"]; ok {
		t.Fatal("a label not chosen reached the record")
	}
	pod.Labels["version"] = "v2"
	if _, err := pods.Update(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "version v2 in the record", func() bool { return meta()["version"] == "v2" })
}

// testRenewal: records outlive the registry's TTL while the bridge leads,
// and a record removed behind its back is re-asserted.
func testRenewal(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 2*time.Second)
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.7.0.1", ""))
	b := h.startBridge(pushlbk8s.Config{})
	h.waitListed("a")
	waitStats(t, b, "three renewals (over a TTL)", func(s pushlbk8s.Stats) bool { return s.Renewals >= 3 })
	if _, ok := h.records()[h.id("a")]; !ok {
		t.Fatal("record expired while the bridge renewed it")
	}
	if err := h.reg.Deregister(t.Context(), "web", h.id("a")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "record re-asserted", func() bool { _, ok := h.records()[h.id("a")]; return ok })
	h.waitListed("a")
}

// testHandOver: the leader stops; the other replica takes over, withdraws
// nothing, re-asserts the records, and then follows changes.
func testHandOver(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.8.0.1", ""), readyEP("b", "10.8.0.2", ""))
	first := h.startBridge(pushlbk8s.Config{Election: pushlbk8s.ElectionConfig{Identity: "first"}})
	waitStats(t, first, "first leads", func(s pushlbk8s.Stats) bool { return s.Leading })
	second := h.startBridge(pushlbk8s.Config{Election: pushlbk8s.ElectionConfig{Identity: "second"}})
	h.waitListed("a", "b")
	entry := func(pod string) serverlist.Entry {
		e, err := h.reg.GetEntry(t.Context(), "web", h.id(pod))
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	before := entry("a")
	if second.Stats().Leading || second.Stats().Writes != 0 {
		t.Fatalf("the follower writes: %+v", second.Stats())
	}

	first.stop()
	waitStats(t, second, "second leads", func(s pushlbk8s.Stats) bool { return s.Leading })
	testutil.Eventually(t, "a re-asserted by the new leader", func() bool { return entry("a").Revision > before.Revision })
	if after := entry("a"); after.Incarnation != before.Incarnation {
		t.Errorf("incarnation changed over the hand-over: %d, then %d", before.Incarnation, after.Incarnation)
	}
	h.waitListed("a", "b")
	if n := h.offline.Load(); n != 0 {
		t.Fatalf("%d offline events over the hand-over, want 0", n)
	}
	h.putSlice("web-1", "web", readyEP("a", "10.8.0.1", ""), readyEP("c", "10.8.0.3", ""))
	h.waitListed("a", "c")
}

// testAPIServerRestart: the API server restarts; the informers resync,
// nothing still ready is withdrawn, and later changes are followed.
func testAPIServerRestart(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.9.0.1", ""), readyEP("b", "10.9.0.2", ""))
	// Election timings that outlast the restart.
	b := h.startBridge(pushlbk8s.Config{Election: pushlbk8s.ElectionConfig{Namespace: h.ns, LeaseDuration: 60 * time.Second, RenewDeadline: 45 * time.Second, RetryPeriod: 500 * time.Millisecond}})
	h.waitListed("a", "b")
	env.RestartAPIServer(t)
	h.putSlice("web-1", "web", readyEP("a", "10.9.0.1", ""), readyEP("b", "10.9.0.2", ""), readyEP("c", "10.9.0.3", ""))
	h.waitListed("a", "b", "c")
	if n := h.offline.Load(); n != 0 {
		t.Fatalf("%d offline events over the API server's restart, want 0", n)
	}
	if !b.Stats().Leading {
		t.Error("the bridge lost its leadership over the restart")
	}
}
