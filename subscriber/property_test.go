package subscriber_test

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// TestPropertyListsConverge: random announce / withdraw / restart sequences
// over several services; the registry is updated in order (it is the
// truth), the events are delivered shuffled and with duplicates. Once
// everything is delivered, every balancer holds exactly the model's list,
// and so does the subscriber's membership table.
func TestPropertyListsConverge(t *testing.T) {
	srv := natstest.Start(t)
	g := startGateway(t, srv, subscriber.Config{Coalesce: time.Millisecond})
	pubc := srv.Connect(t)
	reg := openRegistry(t, pubc)
	iteration := 0

	rapid.Check(t, func(rt *rapid.T) {
		iteration++
		type inst struct {
			inc  int64
			live bool
		}
		services := []string{fmt.Sprintf("p%da", iteration), fmt.Sprintf("p%db", iteration)}
		model := map[string]map[int]*inst{}
		for _, s := range services {
			model[s] = map[int]*inst{}
		}
		var evs []events.Event
		ops := rapid.IntRange(1, 25).Draw(rt, "ops")
		for range ops {
			svc := rapid.SampledFrom(services).Draw(rt, "service")
			j := rapid.IntRange(0, 3).Draw(rt, "instance")
			in := model[svc][j]
			if in == nil {
				in = &inst{}
				model[svc][j] = in
			}
			info := serverlist.Instance{Service: svc, InstanceID: fmt.Sprintf("10.1.0.%d:%s:80", j, svc), Host: "10.1.0.1", Port: 1000 + j}
			op := rapid.SampledFrom([]string{"announce", "withdraw", "restart"}).Draw(rt, "op")
			switch {
			case op == "announce" && !in.live, op == "restart" && in.live:
				in.inc++
				in.live = true
				info.Incarnation = in.inc
				if _, err := reg.Register(rt.Context(), info); err != nil {
					rt.Fatal(err)
				}
				evs = append(evs, events.Event{Kind: events.Online, Service: svc, InstanceID: info.InstanceID, Incarnation: in.inc, At: time.Now()})
			case op == "withdraw" && in.live:
				in.live = false
				evs = append(evs, events.Event{Kind: events.Offline, Service: svc, InstanceID: info.InstanceID, Incarnation: in.inc, At: time.Now()})
				if err := reg.Deregister(rt.Context(), svc, info.InstanceID); err != nil {
					rt.Fatal(err)
				}
			}
		}
		// Deliver shuffled, with duplicates.
		var order []int
		for i := range evs {
			order = append(order, i)
			if rapid.Bool().Draw(rt, "duplicate") {
				order = append(order, i)
			}
		}
		perm := rapid.Permutation(order).Draw(rt, "order")
		received := g.sub.Stats().Received
		for _, i := range perm {
			subj, data, err := events.EncodeMessage(events.DefaultPrefix, evs[i])
			if err != nil {
				rt.Fatal(err)
			}
			if err := pubc.Publish(subj, data); err != nil {
				rt.Fatal(err)
			}
		}
		if err := pubc.Flush(); err != nil {
			rt.Fatal(err)
		}
		want := map[string][]string{}
		for _, s := range services {
			for j, in := range model[s] {
				if in.live {
					want[s] = append(want[s], fmt.Sprintf("10.1.0.%d:%s:80", j, s))
				}
			}
			sort.Strings(want[s])
		}
		// Every event has been processed once Received counts them all (one
		// subscription: in order); only then can the lists be compared.
		waitUntil(rt, "the events to be processed", func() bool { return g.sub.Stats().Received >= received+uint64(len(perm)) })
		var diff string
		converged := func() bool {
			for _, s := range services {
				live := g.sub.Live()[s]
				if got := g.ids(s); !slices.Equal(got, want[s]) || !slices.Equal(live, want[s]) {
					diff = fmt.Sprintf("service %s: gateway has %v, model %v (membership %v)", s, got, want[s], live)
					return false
				}
			}
			return true
		}
		if !poll(converged) {
			rt.Fatal(diff)
		}
	})
}

// waitUntil polls cond until it holds, and fails the test after 20 s (as
// testutil.Eventually does, for a *rapid.T).
func waitUntil(t interface{ Fatalf(string, ...any) }, what string, cond func() bool) {
	if !poll(cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll checks cond every 2 ms for up to 20 s and reports whether it held.
func poll(cond func() bool) bool {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			return cond()
		}
	}
	return true
}
