package permtest

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/testutil"
)

// announceBin is the announce binary the tests run.
var announceBin string

func TestMain(m *testing.M) {
	paths, remove, err := testutil.BuildBinaries("../../cmd/announce")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	announceBin = paths[0]
	code := m.Run()
	if code == 0 {
		http.DefaultClient.CloseIdleConnections()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	remove()
	os.Exit(code)
}
