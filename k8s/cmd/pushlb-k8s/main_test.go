package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestFlags: bad flags exit 2 with a message, -h exits 0. (The command's
// work is tested on a real API server: TestBridge/CommandCrash.)
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, 0, "-selector"},
		{[]string{"-selector", "a in (b"}, 2, "-selector"},
		{[]string{"-no-such-flag"}, 2, "no-such-flag"},
	} {
		var stderr bytes.Buffer
		if code := run(t.Context(), tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("pushlb-k8s %v: exit %d, want %d; output %q should contain %q", tc.args, code, tc.code, stderr.String(), tc.want)
		}
	}
}
