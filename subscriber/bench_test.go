package subscriber_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// registerMany registers instances concurrently and returns when all are in.
func registerMany(tb testing.TB, reg *serverlist.Registry, ins []serverlist.Instance) {
	tb.Helper()
	var wg sync.WaitGroup
	var failed atomic.Value
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ins) {
					return
				}
				if _, err := reg.Register(context.Background(), ins[i]); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkPropagation measures, in the same run, a raw NATS hop (publish
// on one connection, receive on another) and pushlb's propagation (publish
// an online/offline event, until the balancer's snapshot reflects it:
// decode, membership, delivery, lookup in the mirror, SetServers). Events
// are spaced beyond the coalescing window, as independent changes are.
func BenchmarkPropagation(b *testing.B) {
	srv := natstest.Start(b)
	g := startGateway(b, srv, subscriber.Config{})
	pubc := srv.Connect(b)
	reg := openRegistry(b, pubc)
	for i := 1; i <= 3; i++ {
		if _, err := reg.Register(b.Context(), instance("orders", i, 1)); err != nil {
			b.Fatal(err)
		}
	}
	testutil.Eventually(b, "3 servers", func() bool { return len(g.ids("orders")) == 3 })
	bal := g.bals.get("orders")
	changed := make(chan time.Time, 64)
	bal.AddListener(func(_, _ []*balancer.Server) {
		select {
		case changed <- time.Now():
		default:
		}
	})
	<-changed // the initial call

	rawc := srv.Connect(b)
	rawIn := make(chan time.Time, 64)
	if _, err := rawc.Subscribe("raw.hop", func(*nats.Msg) { rawIn <- time.Now() }); err != nil {
		b.Fatal(err)
	}
	rawc.Flush()

	id := instance("orders", 3, 1).InstanceID
	var raw, push []time.Duration
	inc := int64(1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Pacing the load, not ordering: independent changes arrive beyond
		// the 10 ms coalescing window, so each one is delivered at once.
		time.Sleep(12 * time.Millisecond)

		start := time.Now()
		pubc.Publish("raw.hop", []byte(`{"service":"orders"}`))
		pubc.Flush()
		raw = append(raw, (<-rawIn).Sub(start))

		kind := events.Offline
		if i%2 == 1 {
			kind, inc = events.Online, inc+1
		}
		subj, data, _ := events.EncodeMessage(events.DefaultPrefix, events.Event{Kind: kind, Service: "orders", InstanceID: id, Incarnation: inc, At: time.Now()})
		start = time.Now()
		pubc.Publish(subj, data)
		select {
		case t := <-changed:
			push = append(push, t.Sub(start))
		case <-time.After(5 * time.Second):
			b.Fatalf("event %d not propagated", i)
		}
	}
	b.StopTimer()
	r50, r99, p50, p99 := testutil.Percentile(raw, 0.5), testutil.Percentile(raw, 0.99), testutil.Percentile(push, 0.5), testutil.Percentile(push, 0.99)
	b.ReportMetric(float64(r50.Microseconds()), "raw-p50-µs")
	b.ReportMetric(float64(r99.Microseconds()), "raw-p99-µs")
	b.ReportMetric(float64(p50.Microseconds()), "push-p50-µs")
	b.ReportMetric(float64(p99.Microseconds()), "push-p99-µs")
	b.ReportMetric(float64(p99)/float64(r99), "p99-ratio")
}

// BenchmarkStorm: 100 services x 100 instances all restart (20,000
// events): every instance announces offline (10,000 events, until every
// balancer is empty), then online with a new incarnation (10,000 events,
// until every balancer holds its 100 servers again). Registry entries stay,
// so lookups hit the mirror.
func BenchmarkStorm(b *testing.B) {
	const services, perService = 100, 100
	srv := natstest.Start(b)
	g := startGateway(b, srv, subscriber.Config{})
	pubc := srv.Connect(b)
	reg := openRegistry(b, pubc)
	var ins []serverlist.Instance
	for s := range services {
		for i := range perService {
			ins = append(ins, serverlist.Instance{Service: fmt.Sprintf("svc-%d", s), InstanceID: fmt.Sprintf("10.%d.0.%d:svc-%d:80", s, i, s),
				Host: fmt.Sprintf("10.%d.0.%d", s, i), Port: 80, Incarnation: 1})
		}
	}
	registerMany(b, reg, ins)
	every := func(n int) func() bool {
		return func() bool {
			for s := range services {
				if len(g.ids(fmt.Sprintf("svc-%d", s))) != n {
					return false
				}
			}
			return true
		}
	}
	testutil.Eventually(b, "10,000 instances", every(perService))
	publishAll := func(k events.Kind, inc int64) {
		at := time.Now()
		for _, in := range ins {
			subj, data, _ := events.EncodeMessage(events.DefaultPrefix, events.Event{Kind: k, Service: in.Service, InstanceID: in.InstanceID, Incarnation: inc, At: at})
			pubc.Publish(subj, data)
		}
		pubc.Flush()
	}
	// waitFor polls finely: its interval bounds the resolution of the
	// measurement.
	waitFor := func(cond func() bool) {
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatal("the storm did not converge in 30 s")
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	var down, up time.Duration
	inc := int64(1)
	for b.Loop() {
		start := time.Now()
		publishAll(events.Offline, inc)
		waitFor(every(0))
		mid := time.Now()
		inc++
		publishAll(events.Online, inc)
		waitFor(every(perService))
		down += mid.Sub(start)
		up += time.Since(mid)
	}
	n := float64(b.N)
	b.ReportMetric(float64(down.Milliseconds())/n, "ms-all-offline")
	b.ReportMetric(float64(up.Milliseconds())/n, "ms-all-online")
	b.ReportMetric(float64((down+up).Milliseconds())/n, "ms/storm")
}

// BenchmarkRebuild10k: one service with 10,000 live IDs rebuilt from the
// warm mirror (lookups are map reads, then SetServers).
func BenchmarkRebuild10k(b *testing.B) {
	srv := natstest.Start(b)
	nc := srv.Connect(b)
	reg := openRegistry(b, nc)
	var ins []serverlist.Instance
	var ids []string
	for i := range 10000 {
		in := serverlist.Instance{Service: "big", InstanceID: fmt.Sprintf("10.0.%d.%d:big:80", i/250, i%250), Host: fmt.Sprintf("10.0.%d.%d", i/250, i%250), Port: 80, Zone: []string{"a", "b", "c"}[i%3], Incarnation: 1}
		ins = append(ins, in)
		ids = append(ids, in.InstanceID)
	}
	registerMany(b, reg, ins)
	mirror := serverlist.NewMirror(reg, serverlist.MirrorConfig{})
	if err := mirror.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	defer mirror.Close()
	if err := mirror.WaitSynced(b.Context()); err != nil {
		b.Fatal(err)
	}
	testutil.Eventually(b, "a warm mirror", func() bool { return len(mirror.Service("big")) == 10000 })
	lookup, err := serverlist.NewLookup(reg, mirror, serverlist.LookupConfig{})
	if err != nil {
		b.Fatal(err)
	}
	bal, err := balancer.New("big", balancer.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer bal.Close()
	v := lbvisitor.NewVisitor(bal, lookup, lbvisitor.VisitorConfig{Logger: nopLog})
	sort.Strings(ids)
	lists := [2][]string{ids, ids[1:]} // alternate, so every apply changes the list
	rev := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		rev++
		if err := v.Apply(b.Context(), events.ListChanged{Service: "big", InstanceIDs: lists[rev%2], Revision: rev}); err != nil {
			b.Fatal(err)
		}
	}
	if n := len(bal.AllServers()); n < 9999 {
		b.Fatalf("balancer holds %d servers", n)
	}
}
