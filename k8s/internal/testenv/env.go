package testenv

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// Tokens of the users the API server knows (--token-auth-file).
const (
	// AdminToken authenticates "admin" in system:masters.
	AdminToken = "pushlb-test-admin-token"
	// BridgeToken authenticates BridgeUser, the service account of
	// k8s/deploy/rbac.yaml: it may do only what RBAC grants it.
	BridgeToken = "pushlb-test-bridge-token"
	// BridgeUser is the user name of BridgeToken: service account
	// pushlb-k8s of namespace pushlb, as the API server names it.
	BridgeUser = "system:serviceaccount:pushlb:pushlb-k8s"
)

// readyTimeout bounds the start of etcd and of kube-apiserver (about 2 s
// each on an idle machine).
const readyTimeout = 90 * time.Second

// binaries are built once per test process (and once per machine).
var binaries struct {
	once            sync.Once
	apiserver, etcd string
	err             error
}

// Binaries returns the paths of kube-apiserver and etcd, building the
// missing ones (see [CacheDir]). logf reports a build.
func Binaries(ctx context.Context, logf func(string, ...any)) (apiserver, etcdPath string, err error) {
	binaries.once.Do(func() {
		binaries.etcd, binaries.err = etcd.ensure(ctx, logf)
		if binaries.err == nil {
			binaries.apiserver, binaries.err = kubeAPIServer.ensure(ctx, logf)
		}
	})
	return binaries.apiserver, binaries.etcd, binaries.err
}

// Env is a running control plane: one etcd, one kube-apiserver. It ends
// with the test that started it.
type Env struct {
	// Config reaches the API server as "admin" (system:masters).
	Config *rest.Config
	// Client is a clientset of Config.
	Client kubernetes.Interface

	apiserverBin string
	apiserverArg []string
	port         int

	mu        sync.Mutex
	apiserver *testutil.Proc
}

// Start starts etcd and kube-apiserver on loopback and returns once the
// API server's /readyz answers ok. It skips the test (fails it under
// CI=true) when a binary cannot be built.
func Start(tb testing.TB) *Env {
	tb.Helper()
	buildCtx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	apiserverBin, etcdBin, err := Binaries(buildCtx, tb.Logf)
	if err != nil {
		testutil.Missing(tb, "kube-apiserver or etcd could not be built: %v", err)
		return nil
	}
	dir := tb.TempDir()

	etcdPort, peerPort := testutil.FreePort(tb), testutil.FreePort(tb)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	etcdProc := testutil.Start(tb, etcdBin,
		"--name=pushlb-test",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=pushlb-test="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn")
	waitReady(tb, etcdProc, http.DefaultClient, etcdURL+"/health", "etcd")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		tb.Fatal(err)
	}
	keyFile, pubFile, tokens := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub"), filepath.Join(dir, "tokens.csv")
	writeFile(tb, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	writeFile(tb, pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	writeFile(tb, tokens, []byte(AdminToken+",admin,admin-uid,system:masters\n"+
		BridgeToken+","+BridgeUser+",pushlb-k8s-uid,\"system:serviceaccounts,system:serviceaccounts:pushlb\"\n"))

	e := &Env{apiserverBin: apiserverBin, port: testutil.FreePort(tb)}
	e.apiserverArg = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(e.port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + pubFile,
		"--service-account-signing-key-file=" + keyFile,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none",
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	}
	e.Config = &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(e.port),
		BearerToken:     AdminToken,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             1000,
		Burst:           2000,
	}
	e.startAPIServer(tb)
	e.Client, err = kubernetes.NewForConfig(e.Config)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// ConfigAs returns a configuration that reaches the API server with token.
func (e *Env) ConfigAs(token string) *rest.Config {
	c := rest.CopyConfig(e.Config)
	c.BearerToken = token
	return c
}

// startAPIServer starts kube-apiserver and waits for its /readyz.
func (e *Env) startAPIServer(tb testing.TB) {
	tb.Helper()
	p := testutil.StartCmd(tb, exec.Command(e.apiserverBin, e.apiserverArg...))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	waitReady(tb, p, client, e.Config.Host+"/readyz", "kube-apiserver")
	e.mu.Lock()
	e.apiserver = p
	e.mu.Unlock()
}

// RestartAPIServer kills kube-apiserver (SIGKILL: its graceful stop waits
// up to a minute for open watches) and starts it again on the same port
// and etcd; it returns once the new one is ready.
func (e *Env) RestartAPIServer(tb testing.TB) {
	tb.Helper()
	e.mu.Lock()
	p := e.apiserver
	e.mu.Unlock()
	p.Kill(tb)
	e.startAPIServer(tb)
}

// waitReady polls url until it answers 200, and fails the test when the
// process exits first or readyTimeout passes.
func waitReady(tb testing.TB, p *testutil.Proc, client *http.Client, url, what string) {
	tb.Helper()
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	var last string
	for {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-p.Done():
			tb.Fatalf("%s exited before it was ready (last answer: %s):\n%s", what, last, tail(p.Output()))
		case <-deadline.C:
			tb.Fatalf("%s not ready after %v (last answer: %s):\n%s", what, readyTimeout, last, tail(p.Output()))
		case <-tick.C:
		}
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return "[...]" + s[len(s)-4000:]
	}
	return s
}

func writeFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(fmt.Errorf("testenv: %w", err))
	}
}
