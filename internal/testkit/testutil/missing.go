package testutil

import (
	"fmt"
	"os"
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
