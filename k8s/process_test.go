package pushlbk8s_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbk8s "github.com/pushlb/pushlb/k8s"
	"github.com/pushlb/pushlb/k8s/internal/testenv"
	"github.com/pushlb/pushlb/lbhttp"
)

// apply creates the objects of a manifest of deploy/ with client (those
// that exist already are left as they are).
func apply(t *testing.T, client kubernetes.Interface, file string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("deploy", file))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, doc := range strings.Split(string(data), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.Deployment:
			_, err = client.AppsV1().Deployments(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", file, obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: %s: %v", file, kindOf(obj), err)
		}
	}
}

func kindOf(o runtime.Object) string { return fmt.Sprintf("%T", o) }

// ensureNamespace creates namespace ns unless it exists.
func ensureNamespace(t *testing.T, client kubernetes.Interface, ns string) {
	t.Helper()
	_, err := client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// testManifests: the bridge runs with exactly the rights of
// deploy/rbac.yaml (its service account's token), and the API server
// accepts deploy/deployment.yaml.
func testManifests(t *testing.T, env *testenv.Env) {
	h := newHarness(t, env, 0)
	ensureNamespace(t, env.Client, "pushlb")
	apply(t, env.Client, "rbac.yaml")
	apply(t, env.Client, "deployment.yaml")

	asBridge, err := kubernetes.NewForConfig(env.ConfigAs(testenv.BridgeToken))
	if err != nil {
		t.Fatal(err)
	}
	metaAsBridge, err := metadata.NewForConfig(env.ConfigAs(testenv.BridgeToken))
	if err != nil {
		t.Fatal(err)
	}
	// RBAC grants no more than it should.
	if _, err := asBridge.CoreV1().Services(h.ns).Create(t.Context(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "nope"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the bridge's account created a Service (err %v)", err)
	}
	if _, err := env.Client.CoreV1().Pods(h.ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"version": "v1"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.10.0.1", ""))
	b := h.startBridgeWith(asBridge, pushlbk8s.Config{PodLabels: []string{"version"}, Metadata: metaAsBridge,
		Election: pushlbk8s.ElectionConfig{Namespace: "pushlb", Name: "pushlb-k8s-" + h.ns,
			LeaseDuration: electionFast.LeaseDuration, RenewDeadline: electionFast.RenewDeadline, RetryPeriod: electionFast.RetryPeriod}})
	waitStats(t, b, "the bridge leads under its RBAC", func(s pushlbk8s.Stats) bool { return s.Leading })
	h.waitListed("a")
	testutil.Eventually(t, "the pod's label read under the bridge's RBAC", func() bool {
		return h.records()[h.id("a")].Metadata["version"] == "v1"
	})
}

// kubeconfig writes a kubeconfig that reaches env's API server as admin.
func kubeconfig(t *testing.T, env *testenv.Env) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, env.Config.Host, testenv.AdminToken)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testCommandCrash: two pushlb-k8s processes; the leader is SIGKILLed
// while requests flow through the gateway to real backends; the other
// replica takes over within the Lease, withdraws nothing (no request
// fails, no ready pod leaves the gateway's list), re-asserts the records
// and follows the next change. The API server refuses loopback addresses
// in IPv4 slices, so the backends are FQDN endpoints "<pod>.pushlb.test",
// one slice per backend port (as pods with different target port numbers
// get), which the loaded gateway's dialer (standing in for cluster DNS)
// sends to 127.0.0.1.
func testCommandCrash(t *testing.T, env *testenv.Env) {
	paths, remove, err := testutil.BuildBinaries("./cmd/pushlb-k8s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	h := newHarness(t, env, 0)
	h.service("web", nil)
	backend := func(name string) int32 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, name) }))
		t.Cleanup(srv.Close)
		return int32(srv.Listener.Addr().(*net.TCPAddr).Port)
	}
	putBackend := func(pod string) {
		h.putSliceWith("web-"+pod, "web", discoveryv1.AddressTypeFQDN,
			[]discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(backend(pod)), Protocol: ptr(corev1.ProtocolTCP)}},
			readyEP(pod, pod+".pushlb.test", "z1"))
	}
	putBackend("a")
	putBackend("b")
	cfg := kubeconfig(t, env)
	start := func(id string) *testutil.Proc {
		return testutil.Start(t, paths[0], "-kubeconfig", cfg, "-nats", h.srv.URL(), "-namespaces", h.ns,
			"-lease-namespace", h.ns, "-lease-duration", "3s", "-id", id)
	}
	holder := func() string {
		l, err := env.Client.CoordinationV1().Leases(h.ns).Get(t.Context(), "pushlb-k8s", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	g := watchGateway(h)
	first := start("first")
	testutil.Eventually(t, "first holds the Lease", func() bool { return holder() == "first" })
	start("second")
	h.waitListed("a", "b")
	rev := func() uint64 {
		e, err := h.reg.GetEntry(t.Context(), "web", h.id("a"))
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision
	}
	before := rev()

	// Steady load through the gateway: one request at a time, until the
	// takeover is done (at most 60 s or 100,000 requests).
	loopback := func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	gw, err := pushlb.New(h.srv.Connect(t), pushlb.Config{Follow: pushlb.FollowListed, Services: []string{"web"}},
		pushlb.WithTransportOptions(lbhttp.WithTransportTemplate(&http.Transport{DialContext: loopback})))
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	client := &http.Client{Transport: gw.Transport(), Timeout: 5 * time.Second}
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		deadline := time.Now().Add(60 * time.Second)
		for i := 0; i < 100_000 && time.Now().Before(deadline); i++ {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := client.Get("http://web/")
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			if err != nil {
				failed.Add(1)
				continue
			}
			ok.Add(1)
		}
	}()
	testutil.Eventually(t, "requests flow", func() bool { return ok.Load() > 100 })

	killed := time.Now()
	okAtKill := ok.Load()
	first.Kill(t)
	testutil.EventuallyWithin(t, 30*time.Second, "second holds the Lease", func() bool { return holder() == "second" })
	testutil.Eventually(t, "the new leader re-asserts a", func() bool { return rev() > before })
	took := time.Since(killed)
	testutil.Eventually(t, "requests flow after the takeover", func() bool { return ok.Load() > okAtKill+100 })
	close(stop)
	<-loadDone
	t.Logf("leader SIGKILLed; the other replica took over and re-asserted in %v; %d requests succeeded, %d failed", took.Round(time.Millisecond), ok.Load(), failed.Load())
	if n := failed.Load(); n != 0 {
		t.Errorf("%d requests failed over the leader's crash, want 0", n)
	}
	if n := h.offline.Load(); n != 0 {
		t.Fatalf("%d offline events over the crash, want 0", n)
	}
	h.waitListed("a", "b")
	putBackend("c")
	h.waitListed("a", "b", "c")
	// Every list the gateway had since a and b were first listed held them.
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range []string{"a", "b"} {
		if at, ok := g.left[h.id(p)]; ok {
			t.Errorf("the gateway's list lost %s at %v, %v after the SIGKILL", p, at.Format(time.RFC3339Nano), at.Sub(killed))
		}
	}
}
