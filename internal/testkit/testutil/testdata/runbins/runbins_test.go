// Package runbins is the package TestRunWithBinaries tests with go test:
// its TestMain is testutil.RunWithBinaries. With RUNBINS_LEAK set, its test
// leaves a goroutine behind, which the TestMain must report.
package runbins

import (
	"os"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

var echoargs string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(paths []string) { echoargs = paths[0] }, "../echoargs"))
}

func TestRunsTheBuiltBinary(t *testing.T) {
	p := testutil.Start(t, echoargs, "built")
	if code := p.Wait(t, 10*time.Second); code != 0 || p.Stdout() != "built\n" {
		t.Fatalf("exit code %d, stdout %q", code, p.Stdout())
	}
	if os.Getenv("RUNBINS_LEAK") != "" {
		go func() { select {} }()
	}
}
