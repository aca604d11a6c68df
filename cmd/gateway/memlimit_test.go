package main

import (
	"math"
	"os"
	"os/exec"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// The gateway sets the Go runtime's memory limit from -memory-limit
// before it loads anything (read back from /metrics, the runtime's own
// gauge): a size given; GOMEMLIMIT left as the runtime read it under the
// default, auto; no limit with off, GOMEMLIMIT included.
func TestMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		args      []string
		want      float64
	}{
		{"a size", "", []string{"-memory-limit", "96MiB"}, 96 << 20},
		{"auto takes GOMEMLIMIT", "GOMEMLIMIT=64MiB", nil, 64 << 20},
		{"off over GOMEMLIMIT", "GOMEMLIMIT=64MiB", []string{"-memory-limit", "off"}, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
			cmd := exec.Command(bin.gateway, append([]string{"-listen", g.proxy, "-admin", g.admin,
				"-embedded-nats", g.nats, "-data-dir", t.TempDir()}, tc.args...)...)
			cmd.Env = os.Environ()
			if tc.env != "" {
				cmd.Env = append(cmd.Env, tc.env)
			}
			g.Proc = testutil.StartCmd(t, cmd)
			g.WaitFor(t, `"message":"memory limit"`, lineTimeout)
			testutil.Eventually(t, "the gateway's /metrics", func() bool {
				return !math.IsNaN(g.metric("go_gc_gomemlimit_bytes"))
			})
			if got := g.metric("go_gc_gomemlimit_bytes"); got != tc.want {
				t.Errorf("go_gc_gomemlimit_bytes = %g, want %g", got, tc.want)
			}
		})
	}
}
