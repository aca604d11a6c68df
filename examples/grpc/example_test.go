// Package grpcexample_test runs the gRPC example as its users would: real
// server processes registered by announce, the client process, a real
// NATS server.
package grpcexample_test

import (
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

var bin struct{ announce, server, client string }

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(p []string) { bin.announce, bin.server, bin.client = p[0], p[1], p[2] },
		"github.com/pushlb/pushlb/cmd/announce", "./server", "./client"))
}

var answered = regexp.MustCompile(`answered by (\S+)`)

// runClient runs the client for n RPCs and counts the answers per server.
func runClient(t *testing.T, natsURL, zone string, n int) map[string]int {
	t.Helper()
	p := testutil.Start(t, bin.client, "-nats", natsURL, "-zone", zone, "-n", strconv.Itoa(n), "greeter")
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("client exited %d:\n%s", code, p.Output())
	}
	seen := map[string]int{}
	for _, m := range answered.FindAllStringSubmatch(p.Stdout(), -1) {
		seen[m[1]]++
	}
	return seen
}

func TestExample(t *testing.T) {
	srv := natstest.Start(t)
	var holders []*testutil.Proc
	var addrs []string
	for _, zone := range []string{"a", "b"} {
		addr := testutil.FreeAddr(t)
		h := testutil.Start(t, bin.announce, "-nats", srv.URL(), "-service", "greeter", "-zone", zone, "-addr", addr, "-drain", "100ms",
			"--", bin.server, "-listen", addr)
		h.WaitFor(t, "announced", 30*time.Second)
		holders, addrs = append(holders, h), append(addrs, addr)
	}
	// No zone: both servers answer. Zone a: its server only.
	if seen := runClient(t, srv.URL(), "", 12); seen[addrs[0]] == 0 || seen[addrs[1]] == 0 || seen[addrs[0]]+seen[addrs[1]] != 12 {
		t.Fatalf("answers without a zone: %v, want both of %v", seen, addrs)
	}
	if seen := runClient(t, srv.URL(), "a", 6); seen[addrs[0]] != 6 {
		t.Fatalf("answers in zone a: %v, want %s only", seen, addrs[0])
	}
	// The zone a server stops (announce withdraws it, drains, stops it):
	// zone a's client fails over to zone b at once.
	holders[0].Signal(t, syscall.SIGTERM)
	if code := holders[0].Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("announce exited %d:\n%s", code, holders[0].Output())
	}
	if seen := runClient(t, srv.URL(), "a", 6); seen[addrs[1]] != 6 {
		t.Fatalf("answers in zone a after its server left: %v, want %s only", seen, addrs[1])
	}
}
