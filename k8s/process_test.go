package pushlbk8s_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbk8s "github.com/pushlb/pushlb/k8s"
	"github.com/pushlb/pushlb/k8s/internal/testenv"
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
	// RBAC grants no more than it should.
	if _, err := asBridge.CoreV1().Services(h.ns).Create(t.Context(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "nope"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the bridge's account created a Service (err %v)", err)
	}
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.10.0.1", ""))
	b := h.startBridgeWith(asBridge, pushlbk8s.Config{PodLabels: []string{"version"},
		Election: pushlbk8s.ElectionConfig{Namespace: "pushlb", Name: "pushlb-k8s-" + h.ns,
			LeaseDuration: electionFast.LeaseDuration, RenewDeadline: electionFast.RenewDeadline, RetryPeriod: electionFast.RetryPeriod}})
	waitStats(t, b, "the bridge leads under its RBAC", func(s pushlbk8s.Stats) bool { return s.Leading })
	h.waitListed("a")
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

// testCommandCrash: two pushlb-k8s processes; the leader is SIGKILLed;
// the other takes over within the Lease, withdraws nothing, re-asserts the
// records and follows the next change.
func testCommandCrash(t *testing.T, env *testenv.Env) {
	paths, remove, err := testutil.BuildBinaries("./cmd/pushlb-k8s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	h := newHarness(t, env, 0)
	h.service("web", nil)
	h.putSlice("web-1", "web", readyEP("a", "10.11.0.1", "z1"), readyEP("b", "10.11.0.2", "z2"))
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

	killed := time.Now()
	first.Kill(t)
	testutil.EventuallyWithin(t, 30*time.Second, "second holds the Lease", func() bool { return holder() == "second" })
	testutil.Eventually(t, "the new leader re-asserts a", func() bool { return rev() > before })
	t.Logf("leader SIGKILLed; the other replica took over and re-asserted in %v", time.Since(killed).Round(time.Millisecond))
	if n := h.offline.Load(); n != 0 {
		t.Fatalf("%d offline events over the crash, want 0", n)
	}
	h.waitListed("a", "b")
	h.putSlice("web-1", "web", readyEP("a", "10.11.0.1", "z1"), readyEP("b", "10.11.0.2", "z2"), readyEP("c", "10.11.0.3", "z1"))
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
