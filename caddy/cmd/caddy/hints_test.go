package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestHints: a request hint through the caddy binary, configured by a
// Caddyfile, over instances started by announce, two of them with -meta
// hint=canary: requests with the header X-Pushlb-Hint: canary reach both
// canaries and nothing else; requests without it, or with a hint nobody
// carries, reach every instance. A reload with hint_header X-Lane reads
// that header instead, and hint_header - none.
func TestHints(t *testing.T) {
	srv := natstest.Start(t)
	policy := func(block string) func(admin, listen string) string {
		return func(admin, listen string) string {
			return site(admin, listen, pushlbSource(srv.URL(), "a")+"\t\tlb_policy pushlb"+block)
		}
	}
	c := startCaddy(t, policy(""))
	canaries, all := []string{"c-1", "c-2"}, []string{"c-1", "c-2", "o-1", "o-2"}
	for _, name := range canaries {
		announceBackend(t, srv.URL(), "orders", "a", name, "-meta", "hint=canary")
	}
	for _, name := range all[2:] {
		announceBackend(t, srv.URL(), "orders", "a", name)
	}
	testutil.Eventually(t, "four instances listed", func() bool {
		return strings.Contains(c.Output(), `"size":4`)
	})
	cl := client(t)
	// answers sends 40 requests with header: value (none when header is
	// empty) and counts the answers by backend.
	answers := func(header, value string) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for i := range 40 {
			req, _ := http.NewRequest("GET", "http://"+c.listen+"/x", nil)
			if header != "" {
				req.Header.Set(header, value)
			}
			resp, err := cl.Do(req)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %s", i, resp.Status)
			}
			seen[resp.Header.Get("X-Backend")]++
		}
		return seen
	}
	check := func(header, value string, want []string) {
		t.Helper()
		if seen := answers(header, value); !testutil.Exactly(seen, want) {
			t.Errorf("%s: %s: answers %v, want %v and nothing else", header, value, seen, want)
		}
	}
	check("X-Pushlb-Hint", "canary", canaries)
	check("", "", all)
	check("X-Pushlb-Hint", "nobody", all)

	c.reload(t, policy(" {\n\t\t\thint_header X-Lane\n\t\t}"))
	testutil.Eventually(t, "the reload to read X-Lane", func() bool {
		return testutil.Exactly(answers("X-Lane", "canary"), canaries)
	})
	check("X-Pushlb-Hint", "canary", all)

	c.reload(t, policy(" {\n\t\t\thint_header -\n\t\t}"))
	testutil.Eventually(t, "the reload to read no hint", func() bool {
		return testutil.Exactly(answers("X-Lane", "canary"), all)
	})
	check("X-Pushlb-Hint", "canary", all)
}
