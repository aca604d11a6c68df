package pushlb_test

import (
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// TestLateOfflinesEndAHold: a mass offline whose registry removals the
// client applies before its offline events (they come on another
// subscription) is held as a registry loss at first; the events, arriving
// next, end the hold and empty the list.
func TestLateOfflinesEndAHold(t *testing.T) {
	srv := natstest.Start(t)
	var pubs []*publisher.Publisher
	for _, name := range []string{"a", "b"} {
		pubs = append(pubs, announce(t, srv, "orders", "", testpub.Backend(t, name)))
	}
	c := start(t, srv.Connect(t))
	listed := func() int { return listedOf(c, "orders") }
	testutil.Eventually(t, "two listed", func() bool { return listed() == 2 })
	reg := openRegistry(t, srv)
	var ins []serverlist.Instance
	for _, p := range pubs {
		ins = append(ins, p.Instance())
		p.Close()
	}
	for _, in := range ins {
		if err := reg.Deregister(t.Context(), in.Service, in.InstanceID); err != nil {
			t.Fatal(err)
		}
	}
	held := func() bool { ss, _ := c.ServiceStats("orders"); return ss.Held }
	testutil.Eventually(t, "held", held)
	nc := srv.Connect(t)
	for _, in := range ins {
		subj, data, err := events.EncodeMessage("lb", events.Event{Kind: events.Offline, Service: in.Service, InstanceID: in.InstanceID, Incarnation: in.Incarnation, At: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		nc.Publish(subj, data)
	}
	nc.Flush()
	testutil.EventuallyWithin(t, 10*time.Second, "the late offlines to end the hold", func() bool { return listed() == 0 })
}
