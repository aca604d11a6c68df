package gateway

// The gateway's soft memory limit (-memory-limit): the Go runtime's
// (debug.SetMemoryLimit), set before anything is loaded.
//
// Why a flag and what its default is: with Go's default GOGC the heap
// grows to about twice what is live before a collection, so a gateway
// that holds 80 MB (1,000 services x 100 instances) settles near twice that
// RSS (docs/perf/memory.md, "Where the goal of 100 MB ends"). A soft limit trades GC work for memory: the
// runtime collects more often as the heap nears it, and when what is live
// exceeds it, it collects with at most about half the CPU instead of
// failing. A fixed default would be wrong for a fleet ten times larger
// (the gateway would spend that half on the GC), so the default follows
// the container: 90 % of the memory limit of the process's cgroup when it
// has one (a container that would otherwise be killed for going over),
// none otherwise; GOMEMLIMIT, when set, is left as the runtime read it.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitAuto is -memory-limit's default: see chooseMemoryLimit.
const memoryLimitAuto = "auto"

// cgroupShare is the share of a cgroup's memory limit the automatic
// limit takes: the rest is for what the limit does not bound (the
// binary's pages, memory the runtime has not returned yet).
const cgroupShare = 0.9

// cgroupFiles are where a process reads its cgroup's memory limit, v2 then
// v1, under the cgroup file system's mount point (a container sees its
// own cgroup there).
var cgroupFiles = []string{"memory.max", "memory/memory.limit_in_bytes"}

// memoryLimit is the limit chooseMemoryLimit settled on: bytes (0: none
// set here) and where it comes from, for the log.
type memoryLimit struct {
	bytes  int64
	source string
}

// chooseMemoryLimit reads -memory-limit: "auto" (GOMEMLIMIT if set, else
// 90 % of the cgroup's memory limit under cgroupRoot if any, else none),
// "off" (none, GOMEMLIMIT included), or a size in the runtime's
// GOMEMLIMIT syntax (a number of bytes with an optional B, KiB, MiB, GiB
// or TiB suffix). env reads the environment.
func chooseMemoryLimit(spec, cgroupRoot string, env func(string) string) (memoryLimit, error) {
	switch spec {
	case "off":
		return memoryLimit{bytes: math.MaxInt64, source: "off"}, nil
	case memoryLimitAuto, "":
		if v := env("GOMEMLIMIT"); v != "" {
			return memoryLimit{source: "GOMEMLIMIT=" + v}, nil // the runtime applied it
		}
		if n, file := cgroupMemoryLimit(cgroupRoot); n > 0 {
			return memoryLimit{bytes: int64(float64(n) * cgroupShare), source: "90% of " + file}, nil
		}
		return memoryLimit{source: "none (no GOMEMLIMIT, no cgroup memory limit)"}, nil
	}
	n, err := parseByteSize(spec)
	if err != nil {
		return memoryLimit{}, fmt.Errorf("bad -memory-limit %q: want auto, off, or a size such as 96MiB: %w", spec, err)
	}
	return memoryLimit{bytes: n, source: "-memory-limit"}, nil
}

// apply sets the limit, when one was chosen here.
func (l memoryLimit) apply() {
	if l.bytes > 0 {
		debug.SetMemoryLimit(l.bytes)
	}
}

// cgroupMemoryLimit returns the memory limit of the cgroup mounted at
// root and the file it read, or 0 when there is none (no file, "max", or
// the v1 value for no limit, near 2^63).
func cgroupMemoryLimit(root string) (int64, string) {
	for _, name := range cgroupFiles {
		file := filepath.Join(root, name)
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, ""
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, ""
		}
		return n, file
	}
	return 0, ""
}

// parseByteSize parses a size as GOMEMLIMIT writes it: digits and an
// optional unit, B, KiB, MiB, GiB or TiB.
func parseByteSize(s string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}
	num, shift := s, uint(0)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			num, shift = rest, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	switch {
	case err != nil:
		return 0, err
	case n <= 0:
		return 0, errors.New("not a positive size")
	case n > math.MaxInt64>>shift:
		return 0, errors.New("too large")
	}
	return n << shift, nil
}
