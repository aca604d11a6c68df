package dns_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/dns"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// backendAt starts an HTTP backend answering its name on addr ("ip:port";
// port 0 picks one), closed at cleanup.
func backendAt(t *testing.T, name, addr string) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) }))
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// proxied sends n requests to url and counts the answers by body; failed
// requests count under "".
func proxied(url string, n int) map[string]int {
	c := &http.Client{Timeout: 2 * time.Second}
	seen := map[string]int{}
	for range n {
		resp, err := c.Get(url)
		if err != nil {
			seen[""]++
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			seen[""]++
			continue
		}
		seen[string(body)]++
	}
	return seen
}

// followThroughProxy runs the scenario of a proxy that finds a service's
// instances through the responder: two instances are served; a third,
// added, is served; the first, withdrawn, stops receiving requests. The
// test waits on the proxy's answers. start starts the proxy with the
// responder's address and returns its URL; addrs are the instances'
// addresses.
func followThroughProxy(t *testing.T, addrs [3]string, start func(t *testing.T, dnsAddr string) string) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	s := startServer(t, dns.ClientSource(c), dns.Config{})
	b1 := backendAt(t, "b1", addrs[0])
	p1 := announceAt(t, srv, strings.TrimPrefix(b1.URL, "http://"), serverlist.Instance{Service: "orders", InstanceID: "b1"})
	b2 := backendAt(t, "b2", addrs[1])
	announceAt(t, srv, strings.TrimPrefix(b2.URL, "http://"), serverlist.Instance{Service: "orders", InstanceID: "b2"})
	url := start(t, s.Addr())
	served := func(want ...string) func() bool {
		return func() bool {
			seen := proxied(url, 30)
			for _, w := range want {
				if seen[w] == 0 {
					return false
				}
			}
			return len(seen) == len(want)
		}
	}
	testutil.Eventually(t, "b1 and b2 to be served", served("b1", "b2"))
	b3 := backendAt(t, "b3", addrs[2])
	announceAt(t, srv, strings.TrimPrefix(b3.URL, "http://"), serverlist.Instance{Service: "orders", InstanceID: "b3"})
	testutil.Eventually(t, "b3, added, to be served", served("b1", "b2", "b3"))
	withdrawn := time.Now()
	if err := p1.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "b1, withdrawn, to receive no request", served("b2", "b3"))
	t.Logf("the proxy stopped sending to the withdrawn instance within %v", time.Since(withdrawn).Round(time.Millisecond))
}

// HAProxy 2.6 with a resolvers section and server-template over the SRV
// records: ports from the records, addresses from their additional
// section.
func TestHAProxyFollowsSRV(t *testing.T) {
	bin := testutil.Tool(t, "haproxy", "haproxy")
	followThroughProxy(t, [3]string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"}, func(t *testing.T, dnsAddr string) string {
		listen := testutil.FreeAddr(t)
		cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
		os.WriteFile(cfg, []byte(fmt.Sprintf(haproxyConfig, dnsAddr, listen)), 0o600)
		p := testutil.Start(t, bin, "-db", "-f", cfg)
		t.Cleanup(func() { p.Kill(t) })
		return "http://" + listen + "/"
	})
}

// The configuration of docs/dns.md, on the test's ports.
const haproxyConfig = `
global
  log stderr format raw local0 warning

resolvers pushlb
  nameserver pushlb %s
  accepted_payload_size 8192   # larger answers come over TCP anyway (TC)
  hold valid 1s                # re-ask every second
  hold obsolete 0s             # drop a server the answer no longer names at once
  resolve_retries 3
  timeout resolve 1s
  timeout retry 1s

defaults
  mode http
  timeout connect 1s
  timeout client 5s
  timeout server 5s

frontend web
  bind %s
  default_backend orders

backend orders
  balance roundrobin
  server-template orders 10 _orders._tcp.service.pushlb resolvers pushlb init-addr none check
`

// nginx 1.22 (Debian 12): resolver with valid=1s and a variable in
// proxy_pass, which makes it resolve the name at run time. A records carry
// no port: the instances share one on different loopback addresses.
func TestNginxFollowsA(t *testing.T) {
	bin := testutil.Tool(t, "nginx", "nginx-light")
	port := testutil.FreePort(t)
	var addrs [3]string
	for i := range addrs {
		addrs[i] = "127.0.0." + strconv.Itoa(i+2) + ":" + strconv.Itoa(port)
	}
	followThroughProxy(t, addrs, func(t *testing.T, dnsAddr string) string {
		dir := t.TempDir()
		listen := testutil.FreeAddr(t)
		cfg := filepath.Join(dir, "nginx.conf")
		os.WriteFile(cfg, []byte(fmt.Sprintf(nginxConfig, dir, dir, dnsAddr, listen, port)), 0o600)
		p := testutil.Start(t, bin, "-p", dir, "-c", cfg, "-e", "stderr", "-g", "daemon off;")
		t.Cleanup(func() { p.Kill(t) })
		return "http://" + listen + "/"
	})
}

// The configuration of docs/dns.md, on the test's ports and directory.
const nginxConfig = `
pid %s/nginx.pid;
error_log stderr warn;
events {}
http {
  access_log off;
  client_body_temp_path %s;
  resolver %s valid=1s ipv6=off;
  resolver_timeout 2s;
  server {
    listen %s;
    location / {
      set $upstream orders.service.pushlb;
      proxy_pass http://$upstream:%d;
      proxy_next_upstream error timeout;
    }
  }
}
`
