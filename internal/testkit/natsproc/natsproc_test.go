package natsproc_test

import (
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

var bin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(paths []string) { bin = paths[0] }, natsproc.Module))
}

// A stopped node answers nothing until it continues; JetStream answered
// at the start.
func TestStopAndContinue(t *testing.T) {
	c := natsproc.Start(t, bin, 1)
	if c.Node("n0") != 0 || c.Node("n9") != -1 {
		t.Fatalf("Node: n0 at %d, n9 at %d", c.Node("n0"), c.Node("n9"))
	}
	nc := c.Connect(t)
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.Stop(t, 0)
	if err := nc.FlushTimeout(300 * time.Millisecond); err == nil {
		t.Fatal("a stopped node answered a flush")
	}
	c.Continue(t, 0)
	testutil.Eventually(t, "the node to answer again", func() bool {
		return nc.Status() == nats.CONNECTED && nc.FlushTimeout(time.Second) == nil
	})
}
