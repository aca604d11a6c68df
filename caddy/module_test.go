package pushlbcaddy_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/goleak"

	pushlbcaddy "github.com/pushlb/pushlb/caddy"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/subscriber"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		// Caddy's own package-level goroutines (its log buffer, the
		// admin's idle closer) start with its init.
		goleak.IgnoreTopFunction("github.com/caddyserver/caddy/v2.trapSignalsPosix.func1"),
		goleak.IgnoreAnyFunction("github.com/caddyserver/caddy/v2.init.0.func1"),
		// reverse_proxy's cleaner of dynamic upstreams' health state runs
		// for the process's life once a dynamic upstream was used.
		goleak.IgnoreAnyFunction("github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy.(*Upstream).fillDynamicHost.func1.1"),
	)
}

// unmarshal parses one "dynamic pushlb ..." (or "lb_policy pushlb ...")
// into m.
func unmarshal(m caddyfile.Unmarshaler, input string) error {
	return m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
}

// TestCaddyfileSource: each subdirective lands in its JSON field; bad
// input is an error that names the subdirective.
func TestCaddyfileSource(t *testing.T) {
	var u pushlbcaddy.Upstreams
	err := unmarshal(&u, `pushlb orders {
		nats nats://a:4222 nats://b:4222
		nats tls://c:4222
		zone us-east-1a
		creds /etc/creds
		tls_ca /etc/ca.pem
		connect_timeout 3s
		ping_interval 1s
		prefix lb2
		lease 10s
		reaper
		rule BestAvailable
		balancers /etc/pushlb.yaml
		gossip 127.0.0.1:7946 {
			join 10.0.0.1:7946 10.0.0.2:7946
			profile fast
			label prod
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(&u)
	want := `{"service":"orders","zone":"us-east-1a","nats":["nats://a:4222","nats://b:4222","tls://c:4222"],"creds_file":"/etc/creds",` +
		`"tls_ca":"/etc/ca.pem","connect_timeout":3000000000,"ping_interval":1000000000,"prefix":"lb2","lease":10000000000,"reaper":true,"balancers_file":"/etc/pushlb.yaml",` +
		`"rule":"BestAvailable","gossip":{"bind":"127.0.0.1:7946","join":["10.0.0.1:7946","10.0.0.2:7946"],"profile":"fast","label":"prod"}}`
	if string(got) != want {
		t.Fatalf("JSON\n got %s\nwant %s", got, want)
	}

	for _, tc := range []struct{ input, want string }{
		{"pushlb orders {\n bogus 1\n}", `unrecognized pushlb subdirective "bogus"`},
		{"pushlb orders billing", "wrong argument count"},
		{"pushlb orders {\n zone\n}", "wrong argument count"},
		{"pushlb orders {\n zone a b\n}", "zone takes one value"},
		{"pushlb orders {\n zone a\n zone b\n}", "zone already specified"},
		{"pushlb orders {\n lease soon\n}", "lease"},
		{"pushlb orders {\n nats\n}", "wrong argument count"},
		{"pushlb orders {\n gossip {\n  shout loud\n }\n}", `unrecognized pushlb gossip subdirective "shout"`},
	} {
		var u pushlbcaddy.Upstreams
		err := unmarshal(&u, tc.input)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.input, err, tc.want)
		}
	}
}

// TestCaddyfilePolicy: the policy's subdirectives and their errors.
func TestCaddyfilePolicy(t *testing.T) {
	var s pushlbcaddy.Selection
	if err := unmarshal(&s, "pushlb {\n rule Maglev\n hash_header X-User\n}"); err != nil {
		t.Fatal(err)
	}
	if s.Rule != "Maglev" || s.HashHeader != "X-User" {
		t.Fatalf("%+v", &s)
	}
	for _, tc := range []struct{ input, want string }{
		{"pushlb extra", "wrong argument count"},
		{"pushlb {\n hash_everything x\n}", `unrecognized pushlb policy subdirective "hash_everything"`},
		{"pushlb {\n rule\n}", "wrong argument count"},
	} {
		var s pushlbcaddy.Selection
		if err := unmarshal(&s, tc.input); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.input, err, tc.want)
		}
	}
}

// TestValidate: configurations that cannot work are refused before any
// connection, with an error naming the setting.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		u    *pushlbcaddy.Upstreams
		want string
	}{
		{"no service", &pushlbcaddy.Upstreams{}, "no service"},
		{"bad service", &pushlbcaddy.Upstreams{Service: "a.b"}, `service "a.b"`},
		{"two ways to authenticate", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{CredsFile: "/x", Token: "t"}}, "cannot be used together"},
		{"bad URL", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{NATS: []string{"http://x:4222"}}}, "unknown scheme"},
		{"unknown rule", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{Rule: "Fastest"}}, "Fastest"},
		{"bad prefix", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{Prefix: "a b"}}, "Config.Prefix"},
		{"short lease", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{Lease: caddy.Duration(time.Millisecond)}}, "Config.Lease"},
		{"pings slower than the lease", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{Lease: caddy.Duration(10 * time.Second), PingInterval: caddy.Duration(5 * time.Second)}}, "ping_interval"},
		{"missing balancers file", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{BalancersFile: "/nonexistent/pushlb.yaml"}}, "balancers_file"},
		{"bad gossip profile", &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{Gossip: &pushlbcaddy.Gossip{Bind: "127.0.0.1:0", Profile: "slow"}}}, "gossip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.u.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "pushlb") {
				t.Fatalf("Validate: %v, want an error starting with pushlb and naming %q", err, tc.want)
			}
		})
	}
	placeholder := pushlbcaddy.Upstreams{Service: "{http.request.host.labels.2}"}
	if err := placeholder.Validate(); err != nil {
		t.Fatalf("a placeholder service: %v", err)
	}
	var s pushlbcaddy.Selection
	s.Rule = "Fastest"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "Fastest") {
		t.Fatalf("policy with an unknown rule: %v", err)
	}
}

// caddyContext returns a Caddy context for provisioning modules, cancelled
// at cleanup.
func caddyContext(t *testing.T) caddy.Context { return caddyContextB(t) }

func caddyContextB(tb testing.TB) caddy.Context {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	tb.Cleanup(cancel)
	return ctx
}

// provision provisions a source for service on srv with the zone, cleaned
// up at the test's end (or earlier by the test).
func provision(t *testing.T, srv *natstest.Server, service, zone string) *pushlbcaddy.Upstreams {
	t.Helper()
	u := &pushlbcaddy.Upstreams{Service: service, Zone: zone, ClientConfig: pushlbcaddy.ClientConfig{NATS: []string{srv.URL()}}}
	if err := u.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Cleanup() })
	return u
}

// request returns a request with what Caddy's server puts in its context:
// a replacer (with vars, for placeholders) and a variable table.
func request(vars map[string]string) *http.Request {
	r := httptest.NewRequest("GET", "http://example.com/x", nil)
	repl := caddy.NewReplacer()
	for k, v := range vars {
		repl.Set(k, v)
	}
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
	return r.WithContext(ctx)
}

// dials returns the dial addresses of ups.
func dials(ups []*reverseproxy.Upstream) []string {
	var out []string
	for _, u := range ups {
		out = append(out, u.Dial)
	}
	return out
}

// TestSourceFollowsTheService: GetUpstreams follows announcements and
// withdrawals as they are pushed; a call costs two allocations (the
// upstreams Caddy may write into), whatever the list's size.
func TestSourceFollowsTheService(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	u := provision(t, srv, "orders", "")
	r := request(nil)
	if ups, err := u.GetUpstreams(r); err != nil || len(ups) != 0 {
		t.Fatalf("before any announcement: %v, %v", dials(ups), err)
	}
	a, b := testpub.Backend(t, "a"), testpub.Backend(t, "b")
	pa := testpub.Announce(t, nc, "orders", "z1", a)
	testpub.Announce(t, nc, "orders", "z2", b)
	testutil.Eventually(t, "both instances", func() bool {
		ups, _ := u.GetUpstreams(r)
		return len(ups) == 2
	})
	if err := pa.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a's withdrawal", func() bool {
		ups, _ := u.GetUpstreams(r)
		return len(ups) == 1 && ups[0].Dial == b.Listener.Addr().String()
	})
	if n := testing.AllocsPerRun(100, func() { u.GetUpstreams(r) }); n > 2 {
		t.Fatalf("GetUpstreams allocates %v times per call, want 2", n)
	}
}

// TestSourceWithAPlaceholder: one source serves the services a
// placeholder names; a name nothing announced has no upstreams and is
// not followed until it is announced.
func TestSourceWithAPlaceholder(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	u := provision(t, srv, "{svc}", "")
	testpub.Announce(t, nc, "orders", "", testpub.Backend(t, "o"))
	ordersReq, billingReq := request(map[string]string{"svc": "orders"}), request(map[string]string{"svc": "billing"})
	testutil.Eventually(t, "orders", func() bool {
		ups, _ := u.GetUpstreams(ordersReq)
		return len(ups) == 1
	})
	if ups, err := u.GetUpstreams(billingReq); err != nil || len(ups) != 0 {
		t.Fatalf("billing before its announcement: %v, %v", dials(ups), err)
	}
	bill := testpub.Backend(t, "b")
	testpub.Announce(t, nc, "billing", "", bill)
	testutil.Eventually(t, "billing once announced", func() bool {
		ups, _ := u.GetUpstreams(billingReq)
		return len(ups) == 1 && ups[0].Dial == bill.Listener.Addr().String()
	})
	if ups, err := u.GetUpstreams(request(map[string]string{"svc": "no.such"})); err != nil || len(ups) != 0 {
		t.Fatalf("an invalid name: %v, %v", dials(ups), err)
	}
}

// TestClientSharedAcrossConfigs: sources with an equal ClientConfig, in
// the same config or in the next one (a reload), share one NATS
// connection; the zone is per source. The connection closes when the last
// one is cleaned up.
func TestClientSharedAcrossConfigs(t *testing.T) {
	srv := natstest.Start(t)
	before := srv.NumClientsExcept(t, subscriber.AdvisoryCheckName)
	u1 := provision(t, srv, "orders", "a")
	u2 := provision(t, srv, "billing", "b")
	// The client's start opens and closes a short-lived connection of its
	// own (the advisory check), which the server may still list, unnamed,
	// for a moment: the count settles at one (two sources with a
	// connection each would stay at two).
	conns := func() int { return srv.NumClientsExcept(t, subscriber.AdvisoryCheckName) - before }
	testutil.Eventually(t, "one NATS connection for two sources of one registry", func() bool { return conns() == 1 })
	// The next config takes the running client, then the old one goes.
	u3 := provision(t, srv, "orders", "c")
	u1.Cleanup()
	u2.Cleanup()
	testutil.Eventually(t, "one NATS connection after a reload", func() bool { return conns() == 1 })
	nc := srv.Connect(t)
	testpub.Announce(t, nc, "orders", "", testpub.Backend(t, "o"))
	r := request(nil)
	testutil.Eventually(t, "the list through the reloaded source", func() bool {
		ups, _ := u3.GetUpstreams(r)
		return len(ups) == 1
	})
	u3.Cleanup()
	testutil.Eventually(t, "the connection closed with its last source", func() bool { return srv.NumClientsExcept(t, subscriber.AdvisoryCheckName)-before == 1 }) // the test's own nc
}

// TestUnreachableNATS: a NATS server that cannot be reached fails the
// provisioning within connect_timeout, with an error that says so.
func TestUnreachableNATS(t *testing.T) {
	u := &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{
		NATS: []string{"nats://" + testutil.FreeAddr(t)}, ConnectTimeout: caddy.Duration(300 * time.Millisecond)}}
	err := u.Provision(caddyContext(t))
	if err == nil || !strings.Contains(err.Error(), "cannot reach NATS") || !strings.HasPrefix(err.Error(), "pushlb: registry") {
		t.Fatalf("Provision: %v", err)
	}
	u.Cleanup()
}

// TestBalancersFile: the balancer settings of a file reach the services'
// balancers (here the rule).
func TestBalancersFile(t *testing.T) {
	srv := natstest.Start(t)
	file := filepath.Join(t.TempDir(), "pushlb.yaml")
	if err := os.WriteFile(file, []byte("defaults:\n  rule: BestAvailable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u := &pushlbcaddy.Upstreams{Service: "orders", ClientConfig: pushlbcaddy.ClientConfig{NATS: []string{srv.URL()}, BalancersFile: file}}
	if err := u.Provision(caddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer u.Cleanup()
	testpub.Announce(t, srv.Connect(t), "orders", "", testpub.Backend(t, "o"))
	testutil.Eventually(t, "the service's balancer", func() bool {
		return pushlbcaddy.RuleOf(u, "orders") == "BestAvailable"
	})
}
