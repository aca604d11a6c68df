package subscriber_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// cause returns the cause that the latest handled list of service giving
// one for id gives (its own entry, or the list's cause for an ID it lists),
// and whether there is one.
func (g *gateway) cause(service, id string) (events.Change, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := len(g.handled) - 1; i >= 0; i-- {
		lc := g.handled[i]
		if lc.Service != service {
			continue
		}
		if c, ok := lc.Changes[id]; ok {
			return c, true
		}
		if lc.Cause != "" && slices.Contains(lc.InstanceIDs, id) {
			return events.Change{Cause: lc.Cause}, true
		}
	}
	return events.Change{}, false
}

// waitCause waits for a handled list of service that gives id's change the
// cause want.
func (g *gateway) waitCause(t *testing.T, service, id string, want events.Cause) events.Change {
	t.Helper()
	var c events.Change
	testutil.Eventually(t, id+"'s change caused by "+string(want), func() bool {
		var ok bool
		c, ok = g.cause(service, id)
		return ok && c.Cause == want
	})
	return c
}

// TestListChangedCarriesCauses: each delivered list says why each instance
// joined or left: the registry's state at start (resync), an online or
// offline event (with the event's time), a record removed without an event
// (registry), gossip. Where two deliveries could race (an event and its
// record), the test orders them.
func TestListChangedCarriesCauses(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	reg := openRegistry(t, nc)
	first := instance("orders", 1, time.Now().UnixNano())
	if _, err := reg.Register(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, srv, subscriber.Config{})
	g.waitCause(t, "orders", first.InstanceID, events.CauseResync)

	// An online event before its record: announce, with the event's time.
	second := instance("orders", 2, time.Now().UnixNano())
	at := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	received := g.sub.Stats().Received
	publishEvent(t, nc, events.Event{Kind: events.Online, Service: "orders", InstanceID: second.InstanceID, Incarnation: second.Incarnation, At: at})
	testutil.Eventually(t, "the online event handled", func() bool { return g.sub.Stats().Received > received })
	if _, err := reg.Register(t.Context(), second); err != nil {
		t.Fatal(err)
	}
	if c := g.waitCause(t, "orders", second.InstanceID, events.CauseAnnounce); !c.EventAt.Equal(at) {
		t.Errorf("the online's change has the event's time %v, want %v", c.EventAt, at)
	}

	// An offline event: offline.
	publishEvent(t, nc, events.Event{Kind: events.Offline, Service: "orders", InstanceID: second.InstanceID, Incarnation: second.Incarnation, At: at})
	g.waitCause(t, "orders", second.InstanceID, events.CauseOffline)

	// A record removed without an event (the reaper at a lease's end, an
	// operator): registry.
	if err := reg.Deregister(t.Context(), "orders", first.InstanceID); err != nil {
		t.Fatal(err)
	}
	g.waitCause(t, "orders", first.InstanceID, events.CauseRegistry)

	// Gossip declaring the node gone: gossip.
	third := instance("orders", 3, time.Now().UnixNano())
	if _, err := reg.Register(t.Context(), third); err != nil {
		t.Fatal(err)
	}
	g.waitCause(t, "orders", third.InstanceID, events.CauseRegistry) // its record, with no event
	g.sub.GossipGone("orders", third.InstanceID, third.Incarnation)
	g.waitCause(t, "orders", third.InstanceID, events.CauseGossip)
}

// TestFormTwoRecordsAreLoggedOncePerService: records that carry their own
// lease (form 2: renewed by re-writing the record) make every renewal
// reach every gateway; the gateway says so once per service, with what to
// do instead.
func TestFormTwoRecordsAreLoggedOncePerService(t *testing.T) {
	srv := natstest.Start(t)
	reg := openRegistry(t, srv.Connect(t))
	var logs testutil.SyncBuffer
	g := startGateway(t, srv, subscriber.Config{Logger: zerolog.New(&logs).Level(zerolog.WarnLevel)})
	// A renewal is a put of the bytes the mirror holds: the record must be
	// there first (a burst of puts of one key is applied as its last one).
	mirrored := func(in serverlist.Instance) {
		t.Helper()
		testutil.Eventually(t, in.Service+"'s record mirrored", func() bool { _, ok := g.sub.Mirror().Entry(in.Service, in.InstanceID); return ok })
	}
	lines := func(service string) int {
		n := 0
		for _, l := range strings.Split(logs.String(), "\\n") {
			if strings.Contains(l, "form 2") && strings.Contains(l, `"service":"`+service+`"`) {
				n++
			}
		}
		return n
	}
	in := instance("orders", 1, time.Now().UnixNano())
	if _, err := reg.Register(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	mirrored(in)
	for range 3 { // renewals of the record itself
		if _, err := reg.Refresh(t.Context(), in); err != nil {
			t.Fatal(err)
		}
	}
	// A renewal of another service's record after them: its line proves
	// the mirror handled the three before it (one goroutine, in order).
	other := instance("billing", 1, time.Now().UnixNano())
	if _, err := reg.Register(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	mirrored(other)
	if _, err := reg.Refresh(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "billing's form 2 line", func() bool { return lines("billing") == 1 })
	if n := lines("orders"); n != 1 {
		t.Fatalf("%d form 2 lines for orders after 3 renewals, want 1:\\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "form 1") {
		t.Fatalf("the line does not say what to do:\\n%s", logs.String())
	}
}
