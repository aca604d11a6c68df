package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// TestPprofIsOptIn checks that the admin handler serves /debug/pprof/ only
// with Config.Pprof, and that without it the answer says how to turn it on.
func TestPprofIsOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		cfg := testConfig(t)
		cfg.Pprof = on
		g, err := New(cfg, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(g.adminHandler())
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !on && !strings.Contains(string(body), "-pprof") {
				t.Errorf("GET %s without -pprof: %q does not name the flag", path, body)
			}
			if want := map[bool]int{false: 404, true: 200}[on]; resp.StatusCode != want {
				t.Errorf("pprof %v: GET %s: %d, want %d", on, path, resp.StatusCode, want)
			}
		}
		srv.Close()
	}
}
