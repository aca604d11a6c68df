package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// UnderCI reports whether the tests run under CI: the environment variable
// CI is "true", as .ci/run and most CI systems set it.
func UnderCI() bool { return os.Getenv("CI") == "true" }

// Missing ends a test whose real component (a browser, /proc, a host name)
// is missing on this machine. Under CI=true the test fails, so that a
// broken install step cannot pass CI green; on a developer's machine it is
// skipped with the reason.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if UnderCI() {
		t.Fatalf("%s (CI=true: a missing component fails the test)", msg)
		return // Fatalf ends the test; a recording TB's may not
	}
	t.Skip(msg)
}

// Tool returns the path of the program name (haproxy, nginx, dig), from
// PATH or, for a PATH without it (Debian puts daemons there), /usr/sbin;
// when neither has it, it ends the test as Missing does, naming the
// Debian package that installs it.
func Tool(t testing.TB, name, debianPackage string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	if path := filepath.Join("/usr/sbin", name); isExecutable(path) {
		return path
	}
	Missing(t, "%s is not installed (Debian: apt-get install %s)", name, debianPackage)
	return ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
