package main

import (
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	tu "github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// TestSecureInstance: an instance announced with TLS (Secure) is added
// with "ssl" and -tls-options, here verifying its certificate against
// the test server's own authority; HAProxy, plain HTTP in front, reaches
// it over TLS. Announced again plain under the same ID, its server leaves
// and comes back without TLS.
func TestSecureInstance(t *testing.T) {
	ns := natstest.Start(t)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls=%v", r.TLS != nil)
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	// HAProxy 2.6 loads a CA file for a server added at runtime only if
	// its configuration loaded it: a disabled server of a backend of its
	// own names it (docs/haproxy.md).
	h := startHAProxy(t, haproxyConfig{backends: ordersBackend + "backend tls_files\n  server ca 127.0.0.1:1 disabled ssl verify required ca-file " + ca + "\n", frontend: "orders"})
	pub := testpub.AnnounceAt(t, ns.Connect(t, nats.MaxReconnects(-1)), srv.Listener.Addr().String(),
		serverlist.Instance{Service: "orders", InstanceID: "secure", Secure: true, Incarnation: time.Now().UnixNano()})
	startSync(t, "-nats", ns.URL(), "-socket", h.sock, "-tls-options", "verify required ca-file "+ca, "orders")
	name := defaultNamePrefix + "secure"
	h.waitServers(t, "orders", "the server added with TLS", func(s map[string]*haServer) bool { return s[name] != nil && s[name].SSL })
	client := &http.Client{Timeout: 5 * time.Second}
	tu.Eventually(t, "a request through HAProxy answered over TLS", func() bool {
		code, body, err := get(client, h.url("/x"))
		return err == nil && code == 200 && body == "tls=true"
	})

	// The same ID announced plain: HAProxy cannot turn TLS off at runtime,
	// so the server is deleted and added again.
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls=%v", r.TLS != nil)
	}))
	t.Cleanup(plain.Close)
	at := plain.Listener.Addr().(*net.TCPAddr)
	in := pub.Instance()
	in.Secure, in.Host, in.Port = false, at.IP.String(), at.Port
	if err := pub.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	h.waitServers(t, "orders", "the server back without TLS", func(s map[string]*haServer) bool {
		return s[name] != nil && !s[name].SSL && !s[name].maint() && !s[name].draining()
	})
	tu.Eventually(t, "a request through HAProxy answered in plain HTTP", func() bool {
		code, body, err := get(client, h.url("/y"))
		return err == nil && code == 200 && strings.HasPrefix(body, "tls=false")
	})
}
