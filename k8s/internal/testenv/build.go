package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// The versions of the control plane the tests run. kube-apiserver is built
// from k8s.io/kubernetes with each of its ./staging replaces pointed at the
// published module of the same release (StagingVersion); etcd from
// go.etcd.io/etcd/server/v3.
const (
	KubernetesVersion = "v1.37.2"
	StagingVersion    = "v0.37.2"
	EtcdVersion       = "v3.6.16"
)

// CacheDir is where the built binaries are kept, outside any checkout, so
// that only the first run on a machine pays the build (kube-apiserver:
// about 7.5 min on 2 cores): $PUSHLB_K8S_CACHE when set, else
// <user cache dir>/pushlb-k8s ($XDG_CACHE_HOME or ~/.cache on Linux).
func CacheDir() (string, error) {
	if d := os.Getenv("PUSHLB_K8S_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testenv: no cache directory: %w", err)
	}
	return filepath.Join(d, "pushlb-k8s"), nil
}

// binary describes one control-plane binary and how to build it.
type binary struct {
	name    string // file name
	version string // cache key
	module  func(ctx context.Context) (goMod string, err error)
	main    string
	ldflags string // go build -ldflags
}

var kubeAPIServer = binary{
	name:    "kube-apiserver",
	version: KubernetesVersion,
	module:  kubeAPIServerModule,
	// The version the release build stamps (--version, /version).
	ldflags: "-X k8s.io/component-base/version.gitVersion=" + KubernetesVersion,
	main: `package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
`,
}

var etcd = binary{
	name:    "etcd",
	version: EtcdVersion,
	module: func(context.Context) (string, error) {
		return "module pushlb.test/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 " + EtcdVersion + "\n", nil
	},
	main: `package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
`,
}

// stagingReplace matches one "k8s.io/x => ./staging/src/k8s.io/x" line of
// k8s.io/kubernetes's go.mod.
var stagingReplace = regexp.MustCompile(`(?m)^\s*(k8s\.io/[A-Za-z0-9._/-]+)\s+=>\s+\./staging/`)

// kubeAPIServerModule returns the go.mod of the kube-apiserver build: the
// replaces of k8s.io/kubernetes (which a dependent module does not
// inherit) pointed at the published staging modules.
func kubeAPIServerModule(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "pushlb-k8s-mod")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module pushlb.test/probe\n\ngo 1.26.0\n"), 0o644); err != nil {
		return "", err
	}
	out, err := goCmd(ctx, dir, "mod", "download", "-json", "k8s.io/kubernetes@"+KubernetesVersion)
	if err != nil {
		return "", err
	}
	var dl struct{ GoMod, Error string }
	if err := json.Unmarshal(out, &dl); err != nil {
		return "", fmt.Errorf("testenv: go mod download: %w", err)
	}
	if dl.Error != "" {
		return "", fmt.Errorf("testenv: go mod download: %s", dl.Error)
	}
	mod, err := os.ReadFile(dl.GoMod)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("module pushlb.test/kubeapiserver\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes " + KubernetesVersion + "\n\nreplace (\n")
	n := 0
	for _, m := range stagingReplace.FindAllStringSubmatch(string(mod), -1) {
		fmt.Fprintf(&b, "\t%s => %s %s\n", m[1], m[1], StagingVersion)
		n++
	}
	b.WriteString(")\n")
	if n == 0 {
		return "", errors.New("testenv: k8s.io/kubernetes's go.mod has no ./staging replaces")
	}
	return b.String(), nil
}

// path returns where the binary is cached.
func (b binary) path() (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, b.name+"-"+b.version, b.name), nil
}

// ensure returns the cached binary, building it first when it is missing.
// Concurrent callers (test binaries of several packages) build it once:
// the build holds a lock file beside the binary.
func (b binary) ensure(ctx context.Context, logf func(string, ...any)) (string, error) {
	path, err := b.path()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return "", fmt.Errorf("testenv: lock %s: %w", path, err)
	}
	defer unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil // built by another process meanwhile
	}
	logf("testenv: building %s %s into %s (once per machine; kube-apiserver takes minutes)", b.name, b.version, path)
	start := time.Now()
	src, err := os.MkdirTemp("", "pushlb-k8s-build-"+b.name)
	if err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	defer os.RemoveAll(src)
	goMod, err := b.module(ctx)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte(goMod), 0o644); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(b.main), 0o644); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	if _, err := goCmd(ctx, src, "mod", "tidy"); err != nil {
		return "", err
	}
	tmp := path + ".tmp"
	if _, err := goCmd(ctx, src, "build", "-trimpath", "-ldflags", b.ldflags, "-o", tmp, "."); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	logf("testenv: built %s in %v", b.name, time.Since(start).Round(time.Second))
	return path, nil
}

// goCmd runs the go command in dir, outside any workspace, and returns its
// standard output.
func goCmd(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := stderr.String()
		if len(msg) > 4000 {
			msg = msg[len(msg)-4000:]
		}
		return nil, fmt.Errorf("testenv: go %s: %w\n%s", strings.Join(args, " "), err, msg)
	}
	return out, nil
}
