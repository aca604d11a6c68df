package pushlb_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// announceWith registers and announces backend as instance id of service
// with metadata, through the publisher API over its own connection.
func announceWith(t *testing.T, srv *natstest.Server, service, id string, md map[string]string, backend *httptest.Server) *publisher.Publisher {
	t.Helper()
	return testpub.AnnounceAt(t, srv.Connect(t), backend.Listener.Addr().String(),
		serverlist.Instance{Service: service, InstanceID: id, Metadata: md})
}

// Subsets over the push path: instances announced with metadata through
// the publisher, a client's Handler with a canary split, a strict route
// and the hint header, and the library's Transport with balancer.WithHint.
// An instance announced while the gateway runs joins its subset at once;
// withdrawn, it leaves it and the strict route answers 503 again.
func TestSubsetsOverThePushPath(t *testing.T) {
	srv := natstest.Start(t)
	announceWith(t, srv, "orders", "v1-a", map[string]string{"version": "v1"}, testpub.Backend(t, "v1-a"))
	announceWith(t, srv, "orders", "v1-b", map[string]string{"version": "v1"}, testpub.Backend(t, "v1-b"))
	announceWith(t, srv, "orders", "v2-a", map[string]string{"version": "v2", "hint": "canary"}, testpub.Backend(t, "v2-a"))

	split := lbhttp.Route{Prefix: "/canary", Service: "orders", StripPrefix: true, Hints: lbhttp.Hints{Subsets: lbhttp.Subsets{
		Split: []lbhttp.SplitShare{{Subset: "version=v1", Weight: 90}, {Subset: "version=v2", Weight: 10}},
	}}}
	strict := lbhttp.Route{Prefix: "/v3", Service: "orders", StripPrefix: true, Hints: lbhttp.Hints{Subsets: lbhttp.Subsets{
		Subset: "version=v3", Fallback: "none",
	}}}
	var mu sync.Mutex
	observed := map[string]int{}
	c := start(t, srv.Connect(t), pushlb.WithProxyOptions(lbhttp.WithRoutes(split, strict),
		lbhttp.WithSubsetRand(testutil.NewRand(1, 2)),
		lbhttp.WithSubsetObserver(func(service, subset string) {
			mu.Lock()
			observed[service+" "+subset]++
			mu.Unlock()
		})))
	testutil.Eventually(t, "three instances", func() bool {
		b, err := c.Follow(t.Context(), "orders")
		return err == nil && len(b.Servers()) == 3
	})
	front := httptest.NewServer(c.Handler())
	t.Cleanup(front.Close)

	send := func(path string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", front.URL+path, nil)
		for i := 0; i < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		name, _, _ := strings.Cut(string(body), " ")
		return resp.StatusCode, strings.TrimSpace(name)
	}

	const n = 2000
	onV2 := 0
	for range n {
		if _, name := send("/canary/x"); strings.HasPrefix(name, "v2") {
			onV2++
		}
	}
	t.Logf("split 90/10: %d of %d on v2; observed %v", onV2, n, observed)
	if share := float64(onV2) / n * 100; share < 8 || share > 12 {
		t.Fatalf("v2 share %.1f %%, want 10 ± 2", share)
	}
	mu.Lock()
	if observed["orders version=v2"] != onV2 || observed["orders version=v1"] != n-onV2 {
		t.Fatalf("observed %v, v2 answered %d", observed, onV2)
	}
	mu.Unlock()

	for range 20 {
		if _, name := send("/orders/x", "X-Pushlb-Hint", "canary"); name != "v2-a" {
			t.Fatalf("hint canary reached %q", name)
		}
	}
	if status, body := send("/v3/x"); status != http.StatusServiceUnavailable {
		t.Fatalf("no v3 yet: %d %q", status, body)
	}

	hinted := &http.Client{Transport: c.Transport()}
	for range 20 {
		req, _ := http.NewRequestWithContext(balancer.WithHint(t.Context(), "canary"), "GET", "http://orders/x", nil)
		resp, err := hinted.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(string(body), "v2-a ") {
			t.Fatalf("Transport with WithHint(canary) reached %q", body)
		}
	}

	v3 := announceWith(t, srv, "orders", "v3-a", map[string]string{"version": "v3"}, testpub.Backend(t, "v3-a"))
	testutil.Eventually(t, "v3 to serve /v3", func() bool {
		status, name := send("/v3/x")
		return status == 200 && name == "v3-a"
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := v3.Withdraw(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "v3 to leave /v3", func() bool {
		status, _ := send("/v3/x")
		return status == http.StatusServiceUnavailable
	})
}
