package testutil

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestGetAndFetch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "# HELP up Up.\n# TYPE up gauge\nup 1\nservers{service=\"orders\"} 3\nbad x\n")
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "hello %s", r.URL.Path)
		if r.Method != http.MethodGet {
			fmt.Fprintf(w, " %s %s", r.Method, r.Header.Get("X-Test"))
		}
	}))
	defer srv.Close()
	defer http.DefaultClient.CloseIdleConnections() // Get's connections: goleak

	if code, body := Get(t, srv.URL+"/x"); code != http.StatusCreated || body != "hello /x" {
		t.Fatalf("Get = %d %q", code, body)
	}
	// A client of the test's own is used as given.
	var used bool
	own := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		used = true
		return srv.Client().Transport.RoundTrip(r)
	})}
	defer srv.Client().CloseIdleConnections()
	if code, body, err := Fetch(own, srv.URL+"/y"); err != nil || code != http.StatusCreated || body != "hello /y" || !used {
		t.Fatalf("Fetch(own client) = %d %q %v, client used %v", code, body, err, used)
	}

	// A request of the test's own: its method and headers are sent.
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/post", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test", "1")
	if code, body, err := Do(nil, req); err != nil || code != http.StatusCreated || body != "hello /post POST 1" {
		t.Fatalf("Do = %d %q %v", code, body, err)
	}

	// One series of a /metrics page: its value, 0 when absent, NaN when
	// the value or the page cannot be read.
	for series, want := range map[string]float64{"up": 1, `servers{service="orders"}`: 3, "absent": 0} {
		if got := Metric(nil, srv.URL+"/metrics", series); got != want {
			t.Errorf("Metric(%s) = %v, want %v", series, got, want)
		}
	}
	if got := Metric(nil, srv.URL+"/metrics", "bad"); !math.IsNaN(got) {
		t.Errorf("Metric(bad) = %v, want NaN", got)
	}
	if got := Metric(nil, srv.URL+"/other", "up"); !math.IsNaN(got) {
		t.Errorf("Metric of a page that is not a 200 = %v, want NaN", got)
	}

	// A server that is gone: Fetch returns the error, Get fails the test.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	if code, _, err := Fetch(nil, gone.URL); err == nil || code != 0 {
		t.Fatalf("Fetch(closed server) = %d, %v; want an error", code, err)
	}
	failed, msgs := runFake(func(tb testing.TB) {
		Get(tb, gone.URL+"/z")
		t.Error("Get returned")
	})
	if !failed || !strings.Contains(msgs, "GET "+gone.URL+"/z: ") {
		t.Fatalf("failed %v, messages:\n%s", failed, msgs)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// RunWithBinaries as a TestMain, run by go test on testdata/runbins: the
// built binary runs, and a goroutine left by a test fails the run.
func TestRunWithBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	run := func(env ...string) (int, string) {
		cmd := exec.Command("go", "test", "-count=1", "./testdata/runbins")
		cmd.Env = append(os.Environ(), env...)
		p := StartCmd(t, cmd)
		return p.Wait(t, 5*time.Minute), p.Output()
	}
	if code, out := run(); code != 0 || !strings.HasPrefix(out, "ok") {
		t.Fatalf("go test: exit code %d:\n%s", code, out)
	}
	if code, out := run("RUNBINS_LEAK=1"); code == 0 || !strings.Contains(out, "found unexpected goroutines") {
		t.Fatalf("go test with a leaked goroutine: exit code %d:\n%s", code, out)
	}
}
