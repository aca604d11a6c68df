package pushlbk8s_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbk8s "github.com/pushlb/pushlb/k8s"
	"github.com/pushlb/pushlb/k8s/internal/testenv"
	"github.com/pushlb/pushlb/serverlist"
)

// leakOptions are goleak's exceptions: the in-process NATS server's
// goroutines, and those client-go keeps for the life of the process
// (klog's flush daemon, the idle connections of its shared transport).
func leakOptions() []goleak.Option {
	return natstest.IgnoreServerGoroutines(
		goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*clientConnReadLoop).run"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// The control plane's processes belong to TestBridge, not to the subtest.
		goleak.IgnoreAnyFunction("github.com/pushlb/pushlb/internal/testkit/testutil.(*Proc).reap"),
	)
}

// harness is one test's world: a namespace of the shared API server, a
// NATS server with the registry, a gateway (pushlb client) following
// "web", and bridges started on demand.
type harness struct {
	t    testing.TB
	env  *testenv.Env
	kube kubernetes.Interface
	ns   string
	srv  *natstest.Server
	reg  *serverlist.Registry
	gw   *pushlb.Client

	offline atomic.Int64 // offline events of "web" seen
	online  atomic.Int64
}

var nsSeq atomic.Int64

// newHarness builds a harness; ttl is the registry's lease.
func newHarness(t testing.TB, env *testenv.Env, ttl time.Duration) *harness {
	t.Helper()
	h := &harness{t: t, env: env, kube: env.Client}
	h.ns = newNamespace(t, env)
	h.srv = natstest.Start(t)
	nc := h.srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	h.reg, err = serverlist.Open(t.Context(), js, serverlist.RegistryConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	for subj, n := range map[string]*atomic.Int64{"lb.svc.web.offline": &h.offline, "lb.svc.web.online": &h.online} {
		if _, err := nc.Subscribe(subj, func(*nats.Msg) { n.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	h.gw, err = pushlb.New(h.srv.Connect(t), pushlb.Config{Follow: pushlb.FollowListed, Services: []string{"web"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.gw.Close() })
	return h
}

// newNamespace creates a namespace of its own for a test.
func newNamespace(t testing.TB, env *testenv.Env) string {
	t.Helper()
	ns := fmt.Sprintf("t%d-%d", time.Now().UnixNano()%1e6, nsSeq.Add(1))
	if _, err := env.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// bridge is a running Bridge; stop ends it and waits for Run to return.
type bridge struct {
	*pushlbk8s.Bridge
	stop func()
}

// electionFast are short election timings for tests.
var electionFast = pushlbk8s.ElectionConfig{LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 200 * time.Millisecond}

// startBridge starts a bridge on the harness's namespace and NATS server
// with cfg (Namespaces, Election's Namespace and Logger filled in when
// empty). It is stopped at cleanup if the test did not.
func (h *harness) startBridge(cfg pushlbk8s.Config) *bridge {
	h.t.Helper()
	return h.startBridgeWith(h.kube, cfg)
}

// startBridgeWith is startBridge with another Kubernetes client.
func (h *harness) startBridgeWith(kube kubernetes.Interface, cfg pushlbk8s.Config) *bridge {
	h.t.Helper()
	return h.start(kube, h.srv.Connect(h.t), cfg)
}

// startBridgeOn is startBridge on the NATS connection nc.
func (h *harness) startBridgeOn(nc *nats.Conn, cfg pushlbk8s.Config) *bridge {
	h.t.Helper()
	return h.start(h.kube, nc, cfg)
}

func (h *harness) start(kube kubernetes.Interface, nc *nats.Conn, cfg pushlbk8s.Config) *bridge {
	h.t.Helper()
	if cfg.Namespaces == nil {
		cfg.Namespaces = []string{h.ns}
	}
	if cfg.Election.Namespace == "" {
		e := electionFast
		e.Identity = cfg.Election.Identity
		cfg.Election = e
		cfg.Election.Namespace = h.ns
	}
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(h.t)).Level(zerolog.InfoLevel)
	if len(cfg.PodLabels) > 0 && cfg.Metadata == nil {
		meta, err := metadata.NewForConfig(h.env.Config)
		if err != nil {
			h.t.Fatal(err)
		}
		cfg.Metadata = meta
	}
	b, err := pushlbk8s.New(kube, nc, h.reg, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := testutil.Receive(h.t, done, 30*time.Second, "Run to return"); err != nil {
				h.t.Errorf("Run: %v", err)
			}
		})
	}
	h.t.Cleanup(stop)
	return &bridge{Bridge: b, stop: stop}
}

// service creates the Service name with the bridge's label, one port
// "http" unless ports are given.
func (h *harness) service(name string, annotations map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	h.t.Helper()
	if len(ports) == 0 {
		ports = []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}
	}
	svc, err := h.kube.CoreV1().Services(h.ns).Create(h.t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pushlb.io/bridge": "true"}, Annotations: annotations},
		Spec:       corev1.ServiceSpec{Ports: ports},
	}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return svc
}

// ep describes one endpoint of a slice.
type ep struct {
	pod, ip, zone               string
	ready, serving, terminating bool
}

func readyEP(pod, ip, zone string) ep {
	return ep{pod: pod, ip: ip, zone: zone, ready: true, serving: true}
}

// putSlice creates or replaces the EndpointSlice name of Service svc, with
// port "http" 8080, as the endpoint-slice controller writes them.
func (h *harness) putSlice(name, svc string, eps ...ep) {
	h.t.Helper()
	h.putSliceWith(name, svc, discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}}, eps...)
}

func (h *harness) putSliceWith(name, svc string, typ discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...ep) {
	h.t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: typ,
		Ports:       ports,
	}
	for _, e := range eps {
		d := discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready), Serving: ptr(e.serving), Terminating: ptr(e.terminating)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: h.ns, Name: e.pod},
		}
		if e.zone != "" {
			d.Zone = ptr(e.zone)
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	slices := h.kube.DiscoveryV1().EndpointSlices(h.ns)
	cur, err := slices.Get(h.t.Context(), name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = slices.Create(h.t.Context(), s, metav1.CreateOptions{})
	case err == nil:
		s.ResourceVersion = cur.ResourceVersion
		_, err = slices.Update(h.t.Context(), s, metav1.UpdateOptions{})
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) deleteSlice(name string) {
	h.t.Helper()
	if err := h.kube.DiscoveryV1().EndpointSlices(h.ns).Delete(h.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// listed returns the IDs of the gateway's servers of "web", sorted.
func (h *harness) listed() []string {
	b, err := h.gw.Balancer("web")
	if err != nil {
		return nil
	}
	var ids []string
	for _, s := range b.Servers() {
		ids = append(ids, s.ID)
	}
	sort.Strings(ids)
	return ids
}

// waitListed waits until the gateway lists exactly ids (pod names in the
// harness's namespace, port "http").
func (h *harness) waitListed(pods ...string) {
	h.t.Helper()
	want := h.ids(pods...)
	testutil.Eventually(h.t, fmt.Sprintf("gateway lists %v", want), func() bool { return slices.Equal(h.listed(), want) })
}

func (h *harness) ids(pods ...string) []string {
	want := []string{}
	for _, p := range pods {
		want = append(want, h.ns+"/"+p+":http")
	}
	sort.Strings(want)
	if len(want) == 0 {
		return nil
	}
	return want
}

func (h *harness) id(pod string) string { return h.ns + "/" + pod + ":http" }

// records returns the registry's records of "web" by ID.
func (h *harness) records() map[string]serverlist.Instance {
	h.t.Helper()
	list, err := h.reg.List(h.t.Context(), "web")
	if err != nil {
		h.t.Fatal(err)
	}
	out := make(map[string]serverlist.Instance, len(list))
	for _, in := range list {
		out[in.InstanceID] = in
	}
	return out
}

// waitStats waits until cond holds of b's stats.
func waitStats(t testing.TB, b *bridge, what string, cond func(pushlbk8s.Stats) bool) pushlbk8s.Stats {
	t.Helper()
	var s pushlbk8s.Stats
	testutil.Eventually(t, what, func() bool { s = b.Stats(); return cond(s) })
	return s
}

func ptr[T any](v T) *T { return &v }
