package testutil

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// RunWithBinaries is the TestMain of a package whose tests run binaries. It
// builds pkgs with BuildBinaries and hands their paths, in the order of
// pkgs, to set (which keeps them in the package's variables); then it runs
// the tests. When they passed, it closes the idle connections of
// http.DefaultClient (Get's and Fetch's too) and fails the run if a
// goroutine is left (goleak.Find: the processes were reaped, the test's
// servers and clients closed). It removes the binaries and returns the
// exit code; a failed build prints go build's output and returns 1.
//
//	func TestMain(m *testing.M) {
//		os.Exit(testutil.RunWithBinaries(m, func(paths []string) { bin = paths[0] }, "."))
//	}
func RunWithBinaries(m *testing.M, set func(paths []string), pkgs ...string) int {
	paths, remove, err := BuildBinaries(pkgs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	set(paths)
	code := m.Run()
	if code == 0 {
		http.DefaultClient.CloseIdleConnections()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	return code
}

// BuildBinaries builds the main packages pkgs with one go build into a new
// temporary directory, so that a TestMain builds the binaries its tests run
// once. A package is a directory relative to the test's package ("." or
// "../../internal/testkit/testbackend") or an import path. It returns the binaries'
// paths in the order of pkgs, each named after the last element of its
// package path as go build names it, and a function that removes the
// directory. On error there is nothing to remove and the error carries go
// build's output. RunWithBinaries is a TestMain built on it; a package that
// builds on first use (a benchmark's binary) calls it alone.
func BuildBinaries(pkgs ...string) (paths []string, remove func(), err error) {
	if len(pkgs) == 0 {
		return nil, nil, fmt.Errorf("testutil: BuildBinaries: no packages")
	}
	dir, err := os.MkdirTemp("", "pushlb-test-bin-")
	if err != nil {
		return nil, nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	seen := map[string]string{}
	for _, pkg := range pkgs {
		name, err := binaryName(pkg)
		if err != nil {
			remove()
			return nil, nil, err
		}
		if other, ok := seen[name]; ok {
			remove()
			return nil, nil, fmt.Errorf("testutil: BuildBinaries: %s and %s would both build %q", other, pkg, name)
		}
		seen[name] = pkg
		if runtime.GOOS == "windows" {
			name += ".exe"
		}
		paths = append(paths, filepath.Join(dir, name))
	}
	// -o DIR/ writes each command into DIR; one go build links them in
	// parallel.
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, pkgs...)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		remove()
		return nil, nil, fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, out)
	}
	return paths, remove, nil
}

// binaryName is the name go build gives pkg's binary: the last element of
// its import path but a major version suffix, which for a directory of
// this module is the directory's name.
func binaryName(pkg string) (string, error) {
	if pkg == "." || pkg == ".." || strings.HasPrefix(pkg, "./") || strings.HasPrefix(pkg, "../") || filepath.IsAbs(pkg) {
		abs, err := filepath.Abs(pkg)
		if err != nil {
			return "", err
		}
		return filepath.Base(abs), nil
	}
	// A major version suffix (.../nats-server/v2) is not the name: go
	// build takes the element before it.
	base := path.Base(pkg)
	if v, ok := strings.CutPrefix(base, "v"); ok && v != "" && strings.Trim(v, "0123456789") == "" && path.Dir(pkg) != "." {
		return path.Base(path.Dir(pkg)), nil
	}
	return base, nil
}

// LazyBinaries builds its packages with BuildBinaries on first use, once:
// for benchmarks, so that a run without them builds nothing. Its methods
// are safe for concurrent use.
type LazyBinaries struct {
	pkgs   []string
	once   sync.Once
	paths  []string
	remove func()
	err    error
}

// NewLazyBinaries returns the LazyBinaries of pkgs (as BuildBinaries
// takes them).
func NewLazyBinaries(pkgs ...string) *LazyBinaries { return &LazyBinaries{pkgs: pkgs} }

// Paths builds the binaries on its first call and returns their paths in
// the order of the packages; a failed build fails tb, at every call.
func (l *LazyBinaries) Paths(tb testing.TB) []string {
	tb.Helper()
	l.once.Do(func() { l.paths, l.remove, l.err = BuildBinaries(l.pkgs...) })
	if l.err != nil {
		tb.Fatal(l.err)
	}
	return l.paths
}

// Remove removes the binaries, if they were built; a TestMain calls it
// after the run.
func (l *LazyBinaries) Remove() {
	l.once.Do(func() {}) // nothing built from now on
	if l.remove != nil {
		l.remove()
	}
}
