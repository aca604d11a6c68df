package gossip

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// BenchmarkDetection measures how long a crash takes to reach the Handler:
// one instance of an N-node cluster on loopback is shut down without Leave,
// and the time until the observer (the gateway everyone joined) gets
// NodeGone(ReasonDead), and until every survivor has, is recorded. Each
// iteration crashes one node and then starts a replacement, so the cluster
// stays at N. Reported metrics, over all iterations:
//
//	p50-ms, p99-ms        time to the observer's NodeGone
//	all-p50-ms, all-p99-ms  time until the last survivor's NodeGone
//	expected-ms, bound-ms   Profile.DetectionTime(N), for comparison
//	false-gone            NodeGone for nodes that were not crashed
//
// The lan profile takes 6 to 10 s per iteration; choose the count per run:
//
//	go test -run '^$' -bench 'Detection/fast' -benchtime 10x ./gossip/
//	go test -run '^$' -bench 'Detection/lan' -benchtime 3x -timeout 30m ./gossip/
func BenchmarkDetection(b *testing.B) {
	for _, p := range []Profile{ProfileFast, ProfileLAN} {
		for _, n := range []int{5, 20, 50} {
			b.Run(fmt.Sprintf("%s/N=%d", p, n), func(b *testing.B) {
				if n > 20 && testing.Short() {
					// 50 nodes on two cores while other packages build and
					// run (CI's single pass) may not converge in time.
					b.Skip("-short: up to 20 nodes")
				}
				benchDetection(b, p, n)
			})
		}
	}
}

type benchNode struct {
	node *Node
	rec  *recorder
}

func benchDetection(b *testing.B, profile Profile, size int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	start := func(meta Meta, join ...string) benchNode {
		cfg := fastConfig(meta, join...)
		cfg.Profile = profile
		rec := newRecorder()
		n, err := start(ctx, cfg, rec)
		if err != nil {
			b.Fatal(err)
		}
		return benchNode{n, rec}
	}
	observer := start(gatewayMeta())
	nodes := []benchNode{observer}
	defer func() {
		for _, n := range nodes {
			n.node.Close()
		}
	}()
	seq := 0
	newInstance := func() benchNode {
		seq++
		return start(instanceMeta("bench", strconv.Itoa(seq), 1), observer.node.LocalAddr())
	}
	for len(nodes) < size {
		nodes = append(nodes, newInstance())
	}
	converge := func() {
		live := make([]*Node, len(nodes))
		for i, n := range nodes {
			live[i] = n.node
		}
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()
		if err := waitMembers(wctx, size, live...); err != nil {
			b.Fatal(err)
		}
	}
	converge()

	expected, bound := profile.DetectionTime(size)
	var toObserver, toAll []time.Duration
	victim := 0
	crashed := map[string]bool{}
	for b.Loop() {
		victim = victim%(len(nodes)-1) + 1 // never the observer
		v := nodes[victim]
		crashed[v.node.Name()] = true
		t0 := time.Now()
		v.node.Close()

		wctx, wcancel := context.WithTimeout(ctx, 4*bound)
		var last time.Duration
		for i, n := range nodes {
			if i == victim {
				continue
			}
			rec, err := n.rec.wait(wctx, goneNamed(v.node.Name()))
			if err != nil {
				wcancel()
				b.Fatalf("%s never saw %s gone: %v", n.node.Name(), v.node.Name(), err)
			}
			if rec.reason != ReasonDead {
				b.Fatalf("reason %q, want dead", rec.reason)
			}
			d := rec.at.Sub(t0)
			if i == 0 {
				toObserver = append(toObserver, d)
			}
			last = max(last, d)
		}
		wcancel()
		toAll = append(toAll, last)

		nodes[victim] = newInstance()
		converge()
	}

	falseGone := 0
	for _, n := range nodes {
		recs, _ := n.rec.snapshot()
		for _, r := range recs {
			if r.gone && !crashed[r.member.Name] {
				falseGone++
			}
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(testutil.Percentile(toObserver, 0.50)), "p50-ms")
	b.ReportMetric(ms(testutil.Percentile(toObserver, 0.99)), "p99-ms")
	b.ReportMetric(ms(testutil.Percentile(toAll, 0.50)), "all-p50-ms")
	b.ReportMetric(ms(testutil.Percentile(toAll, 0.99)), "all-p99-ms")
	b.ReportMetric(ms(expected), "expected-ms")
	b.ReportMetric(ms(bound), "bound-ms")
	b.ReportMetric(float64(falseGone), "false-gone")
	b.Logf("%s N=%d: %d crashes; observer p50 %v p99 %v; all survivors p50 %v p99 %v; expected %v, bound %v; false NodeGone %d",
		profile, size, len(toObserver),
		testutil.Percentile(toObserver, 0.50).Round(time.Millisecond), testutil.Percentile(toObserver, 0.99).Round(time.Millisecond),
		testutil.Percentile(toAll, 0.50).Round(time.Millisecond), testutil.Percentile(toAll, 0.99).Round(time.Millisecond),
		expected, bound, falseGone)
}
