package testutil

import (
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// httpClient is the client of Get, and of Fetch without a client of its
// own. Its transport is http.DefaultTransport, so that a TestMain's
// http.DefaultClient.CloseIdleConnections (before it looks for leaked
// goroutines) closes its connections too; DefaultTimeout bounds each
// request, body included, so that a server that never answers fails the
// test instead of hanging it.
var httpClient = &http.Client{Timeout: DefaultTimeout}

// Get sends a GET to url and returns the status and the whole body. A
// request that fails, or a body that cannot be read, fails the test. The
// request is bounded by DefaultTimeout (20 s).
//
//	if code, body := testutil.Get(t, "http://"+addr+"/x"); code != 200 || body != "a /x" {
//		t.Fatalf("%d %q", code, body)
//	}
func Get(tb testing.TB, url string) (status int, body string) {
	tb.Helper()
	status, body, err := Fetch(nil, url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	return status, body
}

// Fetch sends a GET to url with client, or with Get's client when client
// is nil, and returns the status and the whole body, or the error of the
// request or of reading the body. It fails no test: a condition that
// Eventually polls calls it while the server may not answer yet, and a
// test gives it a client of its own (a timeout, a transport).
//
//	testutil.Eventually(t, "the gateway to be ready", func() bool {
//		code, _, err := testutil.Fetch(nil, "http://"+admin+"/readyz")
//		return err == nil && code == 200
//	})
func Fetch(client *http.Client, url string) (status int, body string, err error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	return Do(client, req)
}

// Metric reads a Prometheus text page (a /metrics) at url with client, as
// Fetch does, and returns the value of one series, such as
// `pushlb_gossip_members` or `pushlb_servers{service="orders"}` (its name
// and labels as the page writes them): 0 when the series is absent, NaN
// (unequal to everything) when the page cannot be read, is not a 200, or
// the value does not parse. It fails no test: Eventually polls it.
func Metric(client *http.Client, url, series string) float64 {
	code, page, err := Fetch(client, url)
	if err != nil || code != http.StatusOK {
		return math.NaN()
	}
	for line := range strings.Lines(page) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return math.NaN()
			}
			return f
		}
	}
	return 0
}

// Do sends req with client, or with Get's client when client is nil, and
// returns the status and the whole body, or the error of the request or of
// reading the body: Fetch for a request of the test's own (a method,
// headers, a body, a context).
func Do(client *http.Client, req *http.Request) (status int, body string, err error) {
	if client == nil {
		client = httpClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
