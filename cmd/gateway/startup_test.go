package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// Mistakes a new user makes at start-up get the real reason at once, and
// exit 1 (the environment) or 2 (the command line).
func TestStartupMistakesSayWhy(t *testing.T) {
	g := startGateway(t, t.TempDir(), testutil.FreeAddr(t))
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	for _, tc := range []struct {
		name string
		bin  string
		args []string
		code int
		want []string
	}{
		{"a second gateway on the same ports", bin.gateway,
			[]string{"-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats, "-data-dir", t.TempDir()},
			1, []string{"-embedded-nats " + g.nats, "-listen " + g.proxy, "-admin " + g.admin, "address already in use", "-nats nats://"}},
		{"a data directory under a file", bin.gateway,
			[]string{"-listen", testutil.FreeAddr(t), "-admin", "off", "-embedded-nats", testutil.FreeAddr(t), "-data-dir", filepath.Join(file, "nats")},
			1, []string{"-data-dir", "not a directory"}},
		{"a misspelt scheme", bin.gateway, []string{"-nats", "nat://127.0.0.1:4222"},
			2, []string{`unknown scheme "nat"`}},
		{"a misspelt scheme, announce", bin.announce, []string{"-nats", "nat://127.0.0.1:4222", "-service", "orders", "-addr", "127.0.0.1:9"},
			2, []string{`unknown scheme "nat"`}},
		{"the admin port as NATS", bin.gateway,
			[]string{"-listen", testutil.FreeAddr(t), "-admin", "off", "-nats", "nats://" + g.admin},
			1, []string{g.admin + " is an HTTP server", "NATS client port"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Wait fails the test if the process has not exited within
			// exitTimeout: a mistake is reported, not retried. No tighter
			// bound: a loaded CI machine starts processes slowly.
			p := start(t, tc.bin, tc.args...)
			code := p.Wait(t, exitTimeout)
			out := p.Output()
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("the output does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "is the port in use?") {
				t.Errorf("the output guesses:\n%s", out)
			}
			// A gateway that never started does not say it stopped.
			if strings.Contains(out, "gateway stopped") {
				t.Errorf("a failed start logs a stop:\n%s", out)
			}
		})
	}
}
