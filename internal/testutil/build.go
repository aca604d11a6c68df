package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
)

// BuildBinaries builds the main packages pkgs with one go build into a new
// temporary directory, so that a TestMain builds the binaries its tests run
// once. A package is a directory relative to the test's package ("." or
// "../../internal/testbackend") or an import path. It returns the binaries'
// paths in the order of pkgs, each named after the last element of its
// package path as go build names it, and a function that removes the
// directory. On error there is nothing to remove and the error carries go
// build's output.
//
//	bins, remove, err := testutil.BuildBinaries(".", "../../internal/testbackend")
//	if err != nil {
//		fmt.Fprintln(os.Stderr, err)
//		os.Exit(1)
//	}
//	code := m.Run()
//	remove()
//	os.Exit(code)
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
// its import path, which for a directory of this module is the directory's
// name.
func binaryName(pkg string) (string, error) {
	if pkg == "." || pkg == ".." || strings.HasPrefix(pkg, "./") || strings.HasPrefix(pkg, "../") || filepath.IsAbs(pkg) {
		abs, err := filepath.Abs(pkg)
		if err != nil {
			return "", err
		}
		return filepath.Base(abs), nil
	}
	return path.Base(pkg), nil
}
