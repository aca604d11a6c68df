package pushlbcaddy_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestConcurrentRequestsInProcess runs Caddy in the test process (so
// that the race detector sees its handler and these modules together)
// with the pushlb source, once under the pushlb policy and once under
// Caddy's round_robin, with passive health on: concurrent requests all
// succeed and reach both instances. Caddy writes into the upstreams a
// source returns on every request, so a source that shared them between
// requests would be a data race here.
func TestConcurrentRequestsInProcess(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	testpub.Announce(t, nc, "orders", "a", testpub.Backend(t, "a"))
	testpub.Announce(t, nc, "orders", "a", testpub.Backend(t, "b"))
	for _, policy := range []string{"pushlb", "round_robin"} {
		t.Run(policy, func(t *testing.T) {
			listen := testutil.FreeAddr(t)
			// Storage in the test's directory, and no storage cleaning (its
			// lock's refresher outlives the config by seconds).
			cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
				"storage":{"module":"file_system","root":%q},
				"apps":{"tls":{"disable_storage_clean":true},"http":{"servers":{"s":{"listen":["%s"],"automatic_https":{"disable":true},"routes":[{"handle":[{
				"handler":"reverse_proxy",
				"dynamic_upstreams":{"source":"pushlb","service":"orders","zone":"a","nats":["%s"]},
				"load_balancing":{"selection_policy":{"policy":"%s"},"try_duration":"2s"},
				"health_checks":{"passive":{"fail_duration":"10s"}}}]}]}}}}}`, t.TempDir(), listen, srv.URL(), policy)
			if err := caddy.Load([]byte(cfg), true); err != nil {
				t.Fatal(err)
			}
			defer caddy.Stop()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			cl := &http.Client{Transport: tr}
			var (
				mu   sync.Mutex
				seen = map[string]int{}
				wg   sync.WaitGroup
			)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 100 {
						code, body, err := testutil.Fetch(cl, "http://"+listen+"/x")
						if err != nil || code != 200 {
							t.Errorf("request: %d %q %v", code, body, err)
							return
						}
						mu.Lock()
						seen[body[:1]]++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if seen["a"] == 0 || seen["b"] == 0 {
				t.Fatalf("answers by instance: %v", seen)
			}
		})
	}
}
