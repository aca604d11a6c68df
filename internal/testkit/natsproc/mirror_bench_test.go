package natsproc_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// BenchmarkStockMirrorAcrossRegions measures what stock JetStream gives
// a registry replicated between two regions, the baseline of the
// multi-region design: two nats-server processes, each its own JetStream
// domain (a, b), b a leaf node of a through a Link the benchmark can cut
// (natsproc.Regions);
// a KV bucket in a, and in b a KV mirror of it. Reported, each beside the
// other in the same run:
//   - hop-p50/p99-µs: a plain publish in a to a subscriber in b;
//   - mirror-p50/p99-µs: a put in a to the update of a watch of b's mirror;
//   - link-back-ms: after a cut of 30 s (the servers ping every 2 s, so
//     that the leaf node notices; with the default 2 minutes it stays
//     down for minutes), until a publish crosses again both ways and
//     each domain's JetStream answers the other region (Regions.Heal);
//   - mirror-back-ms: until b's mirror holds the last write made in a
//     during the cut. nats-server 2.15.2 finds a stalled mirror every 10 s
//     and retries with a backoff of 5 s or more (stream.go), which no
//     configuration changes.
//
// Not in -short (it takes over a minute).
func BenchmarkStockMirrorAcrossRegions(b *testing.B) {
	if testing.Short() {
		b.Skip("cuts a link for 30 s: not in -short")
	}
	for b.Loop() {
		stockMirror(b)
	}
}

func stockMirror(b *testing.B) {
	// The servers ping every 2 s, and the leaf node dials again every
	// second.
	r := natsproc.StartRegionsWith(b, bin, natsproc.RegionsConfig{PingInterval: 2 * time.Second, Reconnect: time.Second}, "a", "b")
	ncA, ncB := r.Connect(b, "a"), r.Connect(b, "b")
	jsA, _ := jetstream.New(ncA)
	jsB, _ := jetstream.New(ncB)
	ctx := b.Context()
	var kvA, kvB jetstream.KeyValue
	testutil.EventuallyWithin(b, time.Minute, "the bucket in a", func() bool {
		var err error
		kvA, err = jsA.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "reg"})
		return err == nil
	})
	testutil.EventuallyWithin(b, time.Minute, "its mirror in b", func() bool {
		var err error
		kvB, err = jsB.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "reg_a", Mirror: &jetstream.StreamSource{Name: "reg", Domain: "a"}})
		return err == nil
	})
	w, err := kvB.WatchAll(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	<-w.Updates() // the catch-up marker
	sub, err := ncB.SubscribeSync("hop")
	if err != nil {
		b.Fatal(err)
	}
	crosses := func(what string, timeout time.Duration) bool {
		ncA.Publish("hop", []byte(what))
		for {
			m, err := sub.NextMsg(timeout)
			if err != nil {
				return false
			}
			if string(m.Data) == what {
				return true
			}
		}
	}
	testutil.EventuallyWithin(b, time.Minute, "a publish to cross the leaf link", func() bool { return crosses("ready", 50*time.Millisecond) })
	waitValue := func(v string, timeout time.Duration) bool {
		deadline := time.After(timeout)
		for {
			select {
			case e := <-w.Updates():
				if e != nil && string(e.Value()) == v {
					return true
				}
			case <-deadline:
				return false
			}
		}
	}

	// The mirror's consumer may start late (created before the link was up).
	if _, err := kvA.Put(ctx, "svc.warm", []byte("warm")); err != nil {
		b.Fatal(err)
	}
	if !waitValue("warm", time.Minute) {
		b.Fatal("the mirror never started")
	}
	var hop, mirror []time.Duration
	for i := range 300 {
		v := strconv.Itoa(i)
		t0 := time.Now()
		if !crosses(v, 5*time.Second) {
			b.Fatal("a publish did not cross the link")
		}
		hop = append(hop, time.Since(t0))
		t0 = time.Now()
		if _, err := kvA.Put(ctx, "svc.k"+strconv.Itoa(i%10), []byte(v)); err != nil {
			b.Fatal(err)
		}
		if !waitValue(v, 5*time.Second) {
			b.Fatal("a put did not reach the mirror's watch")
		}
		mirror = append(mirror, time.Since(t0))
	}

	r.Cut(b, "b")
	cutAt := time.Now()
	for i := 0; time.Since(cutAt) < 30*time.Second; i++ {
		if _, err := kvA.Put(context.Background(), "svc.cut", []byte("cut-"+strconv.Itoa(i))); err != nil {
			b.Fatal(err)
		}
		if waitValue("never", time.Second) { // a write a second, paced by the watch
			b.Fatal("impossible")
		}
	}
	if _, err := kvA.Put(ctx, "svc.cut", []byte("last")); err != nil {
		b.Fatal(err)
	}
	healed := time.Now()
	r.Heal(b, "b")
	linkBack := time.Since(healed)
	if !waitValue("last", 5*time.Minute) {
		b.Fatal("the mirror never caught up")
	}
	mirrorBack := time.Since(healed)
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) }
	b.ReportMetric(us(quantile(hop, .5)), "hop-p50-µs")
	b.ReportMetric(us(quantile(hop, .99)), "hop-p99-µs")
	b.ReportMetric(us(quantile(mirror, .5)), "mirror-p50-µs")
	b.ReportMetric(us(quantile(mirror, .99)), "mirror-p99-µs")
	b.ReportMetric(float64(linkBack.Milliseconds()), "link-back-ms")
	b.ReportMetric(float64(mirrorBack.Milliseconds()), "mirror-back-ms")
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*q)]
}
