package scale_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// BenchmarkScopedGateway: a gateway process that is only ever asked for
// svc-0, against a registry of the whole fleet (PUSHLB_SCALE), with
// -follow all (every service: the gateway binary's default) and -follow
// requested (the services requested), side by side on one NATS server.
// svc-0 is one real backend; the other services' records are the fleet's.
// Measured: from the gateway's exec until a request for svc-0 through its
// proxy is answered by the backend (routed-ms: in requested mode the first
// request follows svc-0), its resident memory then (rss-MB), and its CPU
// while the fleet's other services replace 100 instances a second
// (churn-cpu-%: a share of one core over the window, 20 s at a size of its
// own), with its resident memory after (rss-after-MB). The churn
// deregisters an instance and registers its successor, as a rolling
// deploy does.
func BenchmarkScopedGateway(b *testing.B) {
	sz := size(b)
	win := window(20*time.Second, time.Second)
	nb := deployments()["single"](b)
	f, _, _ := loadFleet(b, nb, sz)
	pub := nb.connect(b)
	ctx := b.Context()
	// svc-0: one real backend in place of the fleet's records.
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("svc-0")) }))
	b.Cleanup(backend.Close)
	host, port, _ := net.SplitHostPort(backend.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	if err := f.Deregister(ctx, pub, f.Generation(0)[:sz.Instances]...); err != nil {
		b.Fatal(err)
	}
	real := f.Instance(0, 0, 1)
	real.Host, real.Port = host, p
	if err := f.Register(ctx, pub, real); err != nil {
		b.Fatal(err)
	}
	churn := newChurn(f, sz)
	gateway(b)
	for _, mode := range []string{"all", "requested"} {
		b.Run(mode, func(b *testing.B) {
			var routed time.Duration
			var rss, rssAfter int64
			var cpuShare float64
			for b.Loop() {
				listen := testutil.FreeAddr(b)
				start := time.Now()
				proc, _, _ := startGatewayOn(b, nb, listen, "-follow", mode, "-reaper=false")
				for {
					resp, err := http.Get("http://" + listen + "/svc-0/x")
					if err == nil {
						resp.Body.Close()
						if resp.StatusCode == http.StatusOK {
							break
						}
					}
					if time.Since(start) > 5*time.Minute {
						b.Fatalf("svc-0 not routed within 5 minutes (last: %v)", err)
					}
					time.Sleep(time.Millisecond)
				}
				routed += time.Since(start)
				_, rss = procStat(b, proc.Pid())
				cpu0, _ := procStat(b, proc.Pid())
				began := time.Now()
				churn.run(b, ctx, pub, win)
				cpu1, after := procStat(b, proc.Pid())
				cpuShare = float64(cpu1-cpu0) / float64(time.Since(began))
				rssAfter = after
				proc.Stop(b, 30*time.Second)
			}
			b.ReportMetric(float64(routed.Milliseconds())/float64(b.N), "routed-ms")
			b.ReportMetric(float64(rss)/1e6, "rss-MB")
			b.ReportMetric(float64(rssAfter)/1e6, "rss-after-MB")
			b.ReportMetric(100*cpuShare, "churn-cpu-%")
			b.ReportMetric(float64(sz.Total()), "instances")
		})
	}
}

// churn replaces the instances of services other than svc-0, one at a
// time, at 100 a second.
type churn struct {
	f       *scale.Fleet
	sz      scale.Size
	current []serverlist.Instance // of services 1..
	next    int
	gen     int
}

func newChurn(f *scale.Fleet, sz scale.Size) *churn {
	return &churn{f: f, sz: sz, current: f.Generation(0)[sz.Instances:], gen: 2}
}

// run replaces 100 instances a second for win.
func (c *churn) run(b *testing.B, ctx context.Context, nc *nats.Conn, win time.Duration) {
	b.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(win)
	for time.Now().Before(end) {
		<-tick.C
		if len(c.current) == 0 {
			return
		}
		i := c.next % len(c.current)
		c.next += 97 // spread over services
		old := c.current[i]
		s, _ := strconv.Atoi(old.Service[len("svc-"):])
		n := c.f.Instance(s, i%c.sz.Instances, c.gen)
		c.gen++
		if err := c.f.Deregister(ctx, nc, old); err != nil {
			b.Fatal(err)
		}
		if err := c.f.Register(ctx, nc, n); err != nil {
			b.Fatal(err)
		}
		c.current[i] = n
	}
}
