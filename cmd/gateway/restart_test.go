package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestCrashRestartClaimsTheIDAtOnce: an instance run by announce
// (supervise mode) is SIGKILLed with its command and started again at
// once with the same command line, as systemd's Restart=always or a
// container restart does; crashRuns cycles (PUSHLB_CRASH_RUNS=20 gives the
// figures of docs/perf.md). The lease is an hour (the claim's
// watch of a crashed holder's record: half an hour), so only the release
// of the crashed holder's ID lets the restart claim it within the test's
// waits: the gateway's reaper ends the lease and removes the record once
// the connection's advisory came and the probe of the instance failed.
// The restarted instance is then routed. With -follow all the leader
// follows the service; following on request, the service is never asked
// for, so the leader finds the record by the connection's name.
func TestCrashRestartClaimsTheIDAtOnce(t *testing.T) {
	for _, follow := range []string{"all", "requested"} {
		t.Run(follow, func(t *testing.T) {
			g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
			g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats,
				"-data-dir", t.TempDir(), "-lease", "1h", "-follow", follow)
			testutil.Eventually(t, "the gateway", func() bool { return g.state(t) != "" })
			g.waitAdvisoriesOn(t)
			testutil.Eventually(t, "the gateway's reaper to lead", func() bool { return g.metric("pushlb_reaper_leader") == 1 })

			addr := testutil.FreeAddr(t)
			run := func(cycle int) *testutil.Proc {
				return start(t, bin.announce, "-nats", "nats://"+g.nats, "-service", "orders", "-addr", addr, "-id", "r1",
					"-lease", "1h", "-drain", "0s", "--", bin.backend, "-addr", addr, "-name", fmt.Sprintf("c%d", cycle))
			}
			a := run(0)
			a.WaitFor(t, "announced online", lineTimeout)
			cycles := crashRuns(t)
			var claimed, routed []time.Duration
			for c := 1; c <= cycles; c++ {
				child := childOf(t, a.Pid())
				killed := time.Now()
				syscall.Kill(a.Pid(), syscall.SIGKILL)
				syscall.Kill(child, syscall.SIGKILL)
				a.Wait(t, exitTimeout)
				a = run(c)
				a.WaitFor(t, "announced online", lineTimeout)
				claimed = append(claimed, time.Since(killed))
				if follow == "all" {
					name := fmt.Sprintf("c%d", c)
					testutil.Eventually(t, name+" routed", func() bool {
						code, body, err := g.hit("/orders/")
						return err == nil && code == 200 && strings.HasPrefix(body, name+" ")
					})
					routed = append(routed, time.Since(killed))
				}
				// The restart's claim could only succeed through the release
				// (the lease is an hour): the leader decided once per cycle.
				testutil.Eventually(t, "the release decided", func() bool { return released(g) == float64(c) })
			}
			t.Logf("releases: %v released, %v failed (a write whose answer came late: the claim saw it done)",
				g.metric(`pushlb_id_releases_total{result="released"}`), g.metric(`pushlb_id_releases_total{result="failed"}`))
			distribution(t, "SIGKILL of announce and its command, restarted at once: kill to the restart announced online", claimed)
			if len(routed) > 0 {
				distribution(t, "SIGKILL of announce and its command, restarted at once: kill to the restarted instance routed", routed)
			}
		})
	}
}

// released counts the releases the gateway's reaper decided: released,
// or failed (the purge's answer came late; the claim saw it done).
func released(g *gw) float64 {
	return g.metric(`pushlb_id_releases_total{result="released"}`) + g.metric(`pushlb_id_releases_total{result="failed"}`)
}
