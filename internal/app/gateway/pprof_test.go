package gateway

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
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
			code, body := testutil.Get(t, srv.URL+path)
			if !on && !strings.Contains(body, "-pprof") {
				t.Errorf("GET %s without -pprof: %q does not name the flag", path, body)
			}
			if want := map[bool]int{false: 404, true: 200}[on]; code != want {
				t.Errorf("pprof %v: GET %s: %d, want %d", on, path, code, want)
			}
		}
		srv.Close()
	}
}
