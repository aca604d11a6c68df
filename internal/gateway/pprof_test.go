package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rs/zerolog"
)

// TestPprofIsOptIn checks that the admin handler serves /debug/pprof/ only
// with Config.Pprof.
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
			resp.Body.Close()
			if want := map[bool]int{false: 404, true: 200}[on]; resp.StatusCode != want {
				t.Errorf("pprof %v: GET %s: %d, want %d", on, path, resp.StatusCode, want)
			}
		}
		srv.Close()
	}
}
