package scale_test

import (
	"context"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/scale"
)

// BenchmarkHeartbeatForms: the CPU of one gateway that does not lead the
// reapers (-reaper=false) while the fleet refreshes every 10 s, in each
// form of the protocol (docs/protocol.md, section 4), in the same run:
// "form1", the leases kept apart are renewed (no renewal reaches the
// gateway); "form2", every record is put again unchanged (a record that
// carries its lease: every refresh reaches every gateway). Reported: the
// gateway process's CPU over the window as a share of one core, its idle
// CPU before, the refreshes its mirror saw per second, the refreshes sent
// per second. Its sleeps are the measurement windows (CPU time over wall
// time): they order no event and no absence is checked after one.
func BenchmarkHeartbeatForms(b *testing.B) {
	sz := size(b)
	win := window(20*time.Second, time.Second)
	warm := window(3*time.Second, 200*time.Millisecond)
	nb := deployments()["single"](b)
	f, recs, _ := loadFleet(b, nb, sz)
	gateway(b)
	for _, form := range []struct {
		name    string
		refresh func(ctx context.Context, recs []scale.Record) error
	}{{"form1", f.RenewLeases}, {"form2", f.RefreshRecords}} {
		b.Run(form.name, func(b *testing.B) {
			p, admin, _ := startGateway(b, nb, "-reaper=false")
			defer p.Stop(b, 30*time.Second)
			measureFor(window(10*time.Second, 200*time.Millisecond)) // the start's aftermath
			idle := win / 4
			idle0, _ := procStat(b, p.Pid())
			measureFor(idle)
			idle1, _ := procStat(b, p.Pid())

			var cpuShare, seenRate, sentRate float64
			for b.Loop() {
				ctx, cancel := context.WithCancel(b.Context())
				done := make(chan paced, 1)
				go func() { done <- pace(ctx, recs, leasePeriod, form.refresh) }()
				measureFor(warm)
				m0 := scrape(b, admin)
				cpu0, _ := procStat(b, p.Pid())
				start := time.Now()
				measureFor(win)
				cpu1, _ := procStat(b, p.Pid())
				elapsed := time.Since(start)
				m1 := scrape(b, admin)
				cancel()
				res := <-done
				if res.err != nil {
					b.Fatal(res.err)
				}
				cpuShare = (cpu1 - cpu0).Seconds() / elapsed.Seconds()
				seenRate = (m1.refreshes - m0.refreshes) / elapsed.Seconds()
				sentRate = float64(res.sent) / res.elapsed.Seconds()
			}
			if m := scrape(b, admin); m.routed != sz.Total() {
				b.Fatalf("after the refreshes the gateway routes %d instances, want %d", m.routed, sz.Total())
			}
			b.ReportMetric(100*cpuShare, "cpu-%")
			b.ReportMetric(100*(idle1-idle0).Seconds()/idle.Seconds(), "idle-cpu-%")
			b.ReportMetric(seenRate, "seen/s")
			b.ReportMetric(sentRate, "sent/s")
		})
	}
}

// paced is what pace sent, over how long, and why it stopped early.
type paced struct {
	sent    int
	elapsed time.Duration
	err     error
}

// pace refreshes every record of recs once per period, spread evenly (the
// schedule caught up every 5 ms by the clock), with refresh, until ctx
// ends.
func pace(ctx context.Context, recs []scale.Record, period time.Duration, refresh func(context.Context, []scale.Record) error) paced {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	var res paced
	next := 0
	for {
		select {
		case <-ctx.Done():
			res.elapsed = time.Since(start)
			return res
		case <-t.C:
		}
		due := int(int64(time.Since(start)) * int64(len(recs)) / int64(period))
		for res.sent < due {
			end := min(next+due-res.sent, len(recs))
			if err := refresh(ctx, recs[next:end]); err != nil {
				if ctx.Err() == nil {
					res.err = err
				}
				res.elapsed = time.Since(start)
				return res
			}
			res.sent += end - next
			next = end % len(recs)
		}
	}
}

// measureFor lets a benchmark's measurement window (or the settling
// before one) pass: CPU is read from /proc at its two ends. It orders no
// event: what the window measures is whatever happened in it.
func measureFor(d time.Duration) { <-time.After(d) }
