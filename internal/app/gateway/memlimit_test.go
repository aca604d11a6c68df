package gateway

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestChooseMemoryLimit: -memory-limit's sizes, off, and auto, which
// leaves GOMEMLIMIT to the runtime, else takes 90 % of a cgroup v2 or v1
// memory limit, else sets none.
func TestChooseMemoryLimit(t *testing.T) {
	cgroup := func(file, content string) string {
		root := t.TempDir()
		if file != "" {
			path := filepath.Join(root, file)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return root
	}
	noEnv := func(string) string { return "" }
	for _, tc := range []struct {
		name, spec, root string
		env              func(string) string
		want             int64
		source           string
	}{
		{"size MiB", "96MiB", cgroup("", ""), noEnv, 96 << 20, "-memory-limit"},
		{"size bytes", "1000000", cgroup("", ""), noEnv, 1000000, "-memory-limit"},
		{"size B", "4096B", cgroup("", ""), noEnv, 4096, "-memory-limit"},
		{"size GiB over a cgroup", "1GiB", cgroup("memory.max", "536870912\n"), noEnv, 1 << 30, "-memory-limit"},
		{"off", "off", cgroup("memory.max", "536870912\n"), noEnv, math.MaxInt64, "off"},
		{"auto, cgroup v2", "auto", cgroup("memory.max", "536870912\n"), noEnv, 536870912 * 9 / 10, "90% of "},
		{"auto, cgroup v2 without a limit", "auto", cgroup("memory.max", "max\n"), noEnv, 0, "none"},
		{"auto, cgroup v1", "auto", cgroup("memory/memory.limit_in_bytes", "268435456\n"), noEnv, 268435456 * 9 / 10, "90% of "},
		{"auto, cgroup v1 without a limit", "auto", cgroup("memory/memory.limit_in_bytes", "9223372036854771712\n"), noEnv, 0, "none"},
		{"auto, no cgroup", "auto", cgroup("", ""), noEnv, 0, "none"},
		{"auto, GOMEMLIMIT set", "auto", cgroup("memory.max", "536870912\n"), func(k string) string {
			if k == "GOMEMLIMIT" {
				return "80MiB"
			}
			return ""
		}, 0, "GOMEMLIMIT=80MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chooseMemoryLimit(tc.spec, tc.root, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if got.bytes != tc.want || !strings.HasPrefix(got.source, tc.source) {
				t.Errorf("chooseMemoryLimit(%q) = %d (%s), want %d (%s...)", tc.spec, got.bytes, got.source, tc.want, tc.source)
			}
		})
	}
	for _, bad := range []string{"-1", "0", "96M", "MiB", "1.5GiB", "9999999TiB", "lots"} {
		if _, err := chooseMemoryLimit(bad, t.TempDir(), noEnv); err == nil {
			t.Errorf("chooseMemoryLimit(%q): no error", bad)
		}
	}
}

// A bad -memory-limit is a usage error: exit status 2, the flag named.
func TestBadMemoryLimitFlag(t *testing.T) {
	var stderr bytes.Buffer
	if code := Main([]string{"-memory-limit", "lots", "-admin", "off"}, &bytes.Buffer{}, &stderr); code != 2 {
		t.Fatalf("exit status %d, want 2; stderr: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "-memory-limit") {
		t.Errorf("stderr does not name the flag: %s", stderr.String())
	}
}

// A gateway that does not serve profiles records no heap profile; one
// run with -pprof samples at the rate in effect.
func TestHeapProfilingOnlyWithPprof(t *testing.T) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 4096
	setHeapProfiling(true)
	if runtime.MemProfileRate != 4096 {
		t.Errorf("with -pprof: MemProfileRate %d, want the rate in effect, 4096", runtime.MemProfileRate)
	}
	setHeapProfiling(false)
	if runtime.MemProfileRate != 0 {
		t.Errorf("without -pprof: MemProfileRate %d, want 0", runtime.MemProfileRate)
	}
}
