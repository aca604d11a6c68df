package permtest

import (
	"os"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// announceBin is the announce binary the tests run.
var announceBin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(paths []string) { announceBin = paths[0] }, "../../../cmd/announce"))
}
