package serverlist_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/serverlist"
)

// processCPU is the CPU time (user+sys) this process has used: here the
// in-process nats-server and the client together.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLeaseRenewal: what one lease renewal (RefreshLease, a
// compare-and-set) costs the NATS server and the publisher together, as a
// plain lease and as a scheduled one (its message schedule restarted),
// over 1,000 leases in turn, one renewal at a time. cpu-µs/renewal is the
// whole process's CPU (the in-process server and the client), which the
// reaper's receive cost is not part of.
func BenchmarkLeaseRenewal(b *testing.B) {
	for _, form := range []string{"plain", "scheduled"} {
		b.Run(form, func(b *testing.B) {
			srvEnv := newEnv(b, serverlist.RegistryConfig{Bucket: "bench_" + form, TTL: time.Minute})
			reg := srvEnv.reg
			if form == "plain" {
				ctx := testCtx(b, 10*time.Second)
				if _, err := srvEnv.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "plain", History: 1, TTL: time.Minute, LimitMarkerTTL: time.Minute}); err != nil {
					b.Fatal(err)
				}
				var err error
				if reg, err = serverlist.Open(ctx, srvEnv.js, serverlist.RegistryConfig{Bucket: "plain"}); err != nil {
					b.Fatal(err)
				}
			}
			if got := reg.ScheduledLeases(); got != (form == "scheduled") {
				b.Fatalf("scheduled leases: %v", got)
			}
			const n = 1000
			ins := make([]serverlist.Instance, n)
			revs := make([]uint64, n)
			for i := range ins {
				ins[i] = inst("svc", fmt.Sprintf("i%d", i), 8080)
				revs[i] = claim(b, reg, ins[i], "o").Lease
			}
			ctx := testCtx(b, 10*time.Minute)
			i := 0
			cpu0 := processCPU(b)
			for b.Loop() {
				rev, err := reg.RefreshLease(ctx, ins[i].Service, ins[i].InstanceID, "o", revs[i])
				if err != nil {
					b.Fatal(err)
				}
				revs[i] = rev
				i = (i + 1) % n
			}
			b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/renewal")
		})
	}
}
