// Package embed_test runs the two embedding examples as their users would:
// real processes against a real NATS server with announced backends.
package embed_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

var gatewayBin, clientBin, serviceBin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(bins []string) { gatewayBin, clientBin, serviceBin = bins[0], bins[1], bins[2] },
		"./gateway", "./client", "./service"))
}

// answeredBy sends a request through the gateway and returns the name of
// the backend that answered, "" when the request failed (the listener may
// not accept yet).
func answeredBy(url string) string {
	code, body, err := testutil.Fetch(nil, url)
	if err != nil || code != 200 {
		return ""
	}
	name, _, _ := strings.Cut(body, " ")
	return name
}

// lineBackend is testpub.Backend answering with a whole line, "<name>
// <path>\n", as the docs' testbackend does.
func lineBackend(t *testing.T, name string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", name, r.URL.Path)
	}))
	t.Cleanup(s.Close)
	return s
}

// answerLine is a line of the client's output: status, backend, path.
var answerLine = regexp.MustCompile(`^200 hello-[12] /y$`)

func TestEmbeddedGatewayAndClient(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	testpub.Announce(t, nc, "hello", "", testpub.Backend(t, "hello-1"))
	p2 := testpub.Announce(t, nc, "hello", "", lineBackend(t, "hello-2"))

	// The gateway of one's own: it serves the announced instances from its
	// first request on (Start returns once the registry's state is loaded).
	addr := testutil.FreeAddr(t)
	gw := testutil.Start(t, gatewayBin, "-nats", srv.URL(), "-listen", addr)
	gw.WaitFor(t, "serving on", 20*time.Second)
	seen := map[string]bool{}
	testutil.Eventually(t, "both instances through the gateway", func() bool {
		seen[answeredBy("http://"+addr+"/hello/x")] = true
		return seen["hello-1"] && seen["hello-2"]
	})

	// The plain http.Client calls the service by name, balanced over both.
	cl := testutil.Start(t, clientBin, "-nats", srv.URL(), "-n", "6", "http://hello/y")
	if code := cl.Wait(t, 20*time.Second); code != 0 {
		t.Fatalf("client exited %d:\n%s", code, cl.Output())
	}
	// One line per answer, each "200 <backend> /y", no blank line between.
	out := cl.Stdout()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 6 || !strings.Contains(out, "200 hello-1 /y") || !strings.Contains(out, "200 hello-2 /y") {
		t.Fatalf("client output, want 6 lines from both backends:\n%s", out)
	}
	for _, l := range lines {
		if !answerLine.MatchString(l) {
			t.Fatalf("client line %q is not an answer; output:\n%s", l, out)
		}
	}

	// A withdrawn instance gets nothing more through the gateway.
	if err := p2.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "hello-2 to leave the gateway", func() bool {
		for range 4 {
			if answeredBy("http://"+addr+"/hello/z") != "hello-1" {
				return false
			}
		}
		return true
	})
	if code := gw.Stop(t, 10*time.Second); code != 0 {
		t.Fatalf("gateway exited %d:\n%s", code, gw.Output())
	}
}

// TestServiceAnnouncesItself: the service example announces itself with the
// publisher API; the gateway example routes to it from its announcement,
// and its SIGTERM withdraws it before it stops serving.
func TestServiceAnnouncesItself(t *testing.T) {
	srv := natstest.Start(t)
	addr := testutil.FreeAddr(t)
	gw := testutil.Start(t, gatewayBin, "-nats", srv.URL(), "-listen", addr)
	gw.WaitFor(t, "serving", 20*time.Second)
	svcAddr := testutil.FreeAddr(t)
	svc := testutil.Start(t, serviceBin, "-nats", srv.URL(), "-service", "hello", "-listen", svcAddr)
	svc.WaitFor(t, "announced", 20*time.Second)
	id := "127.0.0.1:hello:" + strings.TrimPrefix(svcAddr, "127.0.0.1:")
	testutil.Eventually(t, "the service through the gateway", func() bool { return answeredBy("http://"+addr+"/hello/x") == id })
	svc.Signal(t, syscall.SIGTERM)
	svc.WaitFor(t, "withdrawn", 20*time.Second)
	// Withdrawn before it stopped: the gateway no longer lists it.
	testutil.Eventually(t, "the gateway to answer 503 for hello", func() bool {
		code, _, err := testutil.Fetch(nil, "http://"+addr+"/hello/x")
		return err == nil && code == 503
	})
	if code := svc.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("service exited %d:\n%s", code, svc.Output())
	}
}
