package pushlbcaddy_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/pushlb/pushlb/balancer"
	pushlbcaddy "github.com/pushlb/pushlb/caddy"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// TestCaddyfilePolicyHintHeader: hint_header lands in its JSON field; a
// name that is not a header name is refused by Provision, "-" is not.
func TestCaddyfilePolicyHintHeader(t *testing.T) {
	for input, want := range map[string]string{
		"pushlb {\n hint_header X-Lane\n}": "X-Lane",
		"pushlb {\n hint_header -\n}":      "-",
		"pushlb":                           "",
	} {
		var s pushlbcaddy.Selection
		if err := unmarshal(&s, input); err != nil || s.HintHeader != want {
			t.Errorf("%q: hint_header %q, %v; want %q", input, s.HintHeader, err, want)
		}
		if err := s.Provision(caddyContext(t)); err != nil {
			t.Errorf("%q: Provision: %v", input, err)
		}
	}
	for _, tc := range []struct{ input, want string }{
		{"pushlb {\n hint_header\n}", "wrong argument count"},
		{"pushlb {\n hint_header a b\n}", "hint_header takes one value"},
		{"pushlb {\n hint_header a\n hint_header b\n}", "hint_header already specified"},
	} {
		var s pushlbcaddy.Selection
		if err := unmarshal(&s, tc.input); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to contain %q", tc.input, err, tc.want)
		}
	}
	bad := pushlbcaddy.Selection{HintHeader: "X Lane"}
	if err := bad.Provision(caddyContext(t)); err == nil || !strings.Contains(err.Error(), "hint_header") {
		t.Fatalf("a bad hint_header: %v, want an error naming hint_header", err)
	}
}

// canaryFleet announces two backends with metadata hint=canary and two
// without, as instances of orders in zone a, and returns the names and
// addresses of each pair.
type canaryFleet struct {
	canaries, others map[string]string // name → address
}

func announceCanaries(t *testing.T, srv *natstest.Server) canaryFleet {
	t.Helper()
	nc := srv.Connect(t)
	f := canaryFleet{canaries: map[string]string{}, others: map[string]string{}}
	for _, name := range []string{"c1", "c2", "o1", "o2"} {
		b := testpub.Backend(t, name)
		in := serverlist.Instance{Service: "orders", InstanceID: b.URL, Zone: "a"}
		group := f.others
		if name[0] == 'c' {
			in.Metadata = map[string]string{balancer.HintKey: "canary"}
			group = f.canaries
		}
		testpub.AnnounceAt(t, nc, b.Listener.Addr().String(), in)
		group[name] = b.Listener.Addr().String()
	}
	return f
}

// all returns every name of f.
func (f canaryFleet) all() []string {
	var out []string
	for _, g := range []map[string]string{f.canaries, f.others} {
		for n := range g {
			out = append(out, n)
		}
	}
	return out
}

// names returns the names of group.
func names(group map[string]string) []string {
	var out []string
	for n := range group {
		out = append(out, n)
	}
	return out
}

// TestPolicyHints: under the pushlb policy a request with the hint header
// is handed the hinted instances only (the pick and its stand-ins), both
// of them over several requests; one without it, or with a hint nobody
// carries, any instance.
func TestPolicyHints(t *testing.T) {
	srv := natstest.Start(t)
	u := provision(t, srv, "orders", "a")
	s := selection(t, &pushlbcaddy.Selection{})
	f := announceCanaries(t, srv)
	testutil.Eventually(t, "four instances", func() bool {
		ups, _ := u.GetUpstreams(request(nil))
		return len(ups) == 4
	})
	byAddr := map[string]string{}
	for _, g := range []map[string]string{f.canaries, f.others} {
		for n, a := range g {
			byAddr[a] = n
		}
	}
	run := func(header http.Header) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for range 40 {
			a := try(t, u, s, header)
			if a.chosen == nil {
				t.Fatal("no upstream chosen")
			}
			seen[byAddr[a.chosen.Dial]]++
			if header.Get(pushlbcaddy.DefaultHintHeader) == "canary" {
				for _, up := range a.pool {
					if _, ok := f.canaries[byAddr[up.Dial]]; !ok {
						t.Fatalf("a hinted request was handed %s (%s) among %v", up.Dial, byAddr[up.Dial], dials(a.pool))
					}
				}
			}
			a.answered()
		}
		return seen
	}
	try(t, u, s, nil).answered() // the source learns the policy: picks from now on
	hinted := http.Header{pushlbcaddy.DefaultHintHeader: {"canary"}}
	if seen := run(hinted); !testutil.Exactly(seen, names(f.canaries)) {
		t.Fatalf("hinted requests: %v, want both canaries and nothing else", seen)
	}
	if seen := run(nil); !testutil.Exactly(seen, f.all()) {
		t.Fatalf("requests without a hint: %v, want every instance", seen)
	}
	if seen := run(http.Header{pushlbcaddy.DefaultHintHeader: {"nobody"}}); !testutil.Exactly(seen, f.all()) {
		t.Fatalf("a hint no instance carries: %v, want every instance (fallback)", seen)
	}
	// A handler of its own: a source serves the policy of its handler.
	u2 := provision(t, srv, "orders", "a")
	off := selection(t, &pushlbcaddy.Selection{HintHeader: "-"})
	testutil.Eventually(t, "four instances", func() bool {
		ups, _ := u2.GetUpstreams(request(nil))
		return len(ups) == 4
	})
	seen := map[string]int{}
	for range 40 {
		a := try(t, u2, off, hinted)
		seen[byAddr[a.chosen.Dial]]++
		a.answered()
	}
	if !testutil.Exactly(seen, f.all()) {
		t.Fatalf("hint_header -: %v, want every instance", seen)
	}
}

// TestHintsInProcess runs Caddy in the test process with the pushlb
// source and policy, under the race detector: one server reads the
// default hint header, one reads X-Lane, one none. Concurrent requests
// with the hint reach both canaries and nothing else; without it, or
// with a hint nobody carries, every instance.
func TestHintsInProcess(t *testing.T) {
	srv := natstest.Start(t)
	f := announceCanaries(t, srv)
	listen := map[string]string{"default": testutil.FreeAddr(t), "lane": testutil.FreeAddr(t), "off": testutil.FreeAddr(t)}
	policy := map[string]string{"default": `{"policy":"pushlb"}`, "lane": `{"policy":"pushlb","hint_header":"X-Lane"}`, "off": `{"policy":"pushlb","hint_header":"-"}`}
	var servers []string
	for name, addr := range listen {
		servers = append(servers, fmt.Sprintf(`%q:{"listen":["%s"],"automatic_https":{"disable":true},"routes":[{"handle":[{
			"handler":"reverse_proxy",
			"dynamic_upstreams":{"source":"pushlb","service":"orders","zone":"a","nats":["%s"]},
			"load_balancing":{"selection_policy":%s,"try_duration":"2s"}}]}]}`, name, addr, srv.URL(), policy[name]))
	}
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"storage":{"module":"file_system","root":%q},
		"apps":{"tls":{"disable_storage_clean":true},"http":{"servers":{%s}}}}`, t.TempDir(), strings.Join(servers, ","))
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	defer caddy.Stop()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr}
	// answers sends 4 x 50 concurrent requests to server with header and
	// counts the answers by backend.
	answers := func(server, header, value string) map[string]int {
		var (
			mu   sync.Mutex
			seen = map[string]int{}
			wg   sync.WaitGroup
		)
		for range 4 {
			wg.Go(func() {
				for range 50 {
					req, _ := http.NewRequest("GET", "http://"+listen[server]+"/x", nil)
					if header != "" {
						req.Header.Set(header, value)
					}
					code, body, err := testutil.Do(cl, req)
					if err != nil || code != 200 {
						t.Errorf("%s: request: %d %q %v", server, code, body, err)
						return
					}
					mu.Lock()
					seen[strings.Fields(body)[0]]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return seen
	}
	reached := map[string]bool{}
	testutil.Eventually(t, "every instance through caddy", func() bool {
		if code, body, err := testutil.Fetch(cl, "http://"+listen["default"]+"/x"); err == nil && code == 200 {
			reached[strings.Fields(body)[0]] = true
		}
		return len(reached) == 4
	})
	for _, tc := range []struct {
		server, header, value string
		want                  []string
	}{
		{"default", pushlbcaddy.DefaultHintHeader, "canary", names(f.canaries)},
		{"default", pushlbcaddy.DefaultHintHeader, "nobody", f.all()},
		{"default", "", "", f.all()},
		{"lane", "X-Lane", "canary", names(f.canaries)},
		{"lane", pushlbcaddy.DefaultHintHeader, "canary", f.all()},
		{"off", pushlbcaddy.DefaultHintHeader, "canary", f.all()},
	} {
		if seen := answers(tc.server, tc.header, tc.value); !testutil.Exactly(seen, tc.want) {
			t.Errorf("server %s, %s: %s: answers %v, want %v and nothing else", tc.server, tc.header, tc.value, seen, tc.want)
		}
	}
}
