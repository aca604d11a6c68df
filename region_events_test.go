package pushlb_test

import (
	"slices"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// listed returns the IDs c's balancer of service lists, sorted.
func listed(t *testing.T, c *pushlb.Client, service string) []string {
	t.Helper()
	b, err := c.Balancer(service)
	if err != nil {
		return nil
	}
	var ids []string
	for _, s := range b.Servers() {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestRegionOfEventsIsTheClients: Config.Region reaches the subscriber. A
// client in us, whose own instance is "orders-1", drops the offline of eu's
// "orders-1" that NATS forwards from region eu, counted as "other_region",
// and keeps routing to its instance; a client without a region applies the
// same event, as before regions; an offline of the own region applies.
func TestRegionOfEventsIsTheClients(t *testing.T) {
	srv := natstest.Start(t)
	us := startWith(t, srv.Connect(t), pushlb.Config{Region: "us", Services: []string{"orders"}})
	anyRegion := startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowAll})
	in := serverlist.Instance{Service: "orders", InstanceID: "orders-1", Region: "us", Incarnation: time.Now().UnixNano()}
	testpub.AnnounceAt(t, srv.Connect(t), "127.0.0.1:9001", in)
	for _, c := range []*pushlb.Client{us, anyRegion} {
		testutil.Eventually(t, "orders-1 listed", func() bool { return slices.Equal(listed(t, c, "orders"), []string{"orders-1"}) })
	}

	offline := func(region string) {
		subj, data, err := events.EncodeMessage("lb", events.Event{Kind: events.Offline, Service: "orders", InstanceID: "orders-1",
			Incarnation: in.Incarnation + 1, At: time.Now(), Region: region})
		if err != nil {
			t.Fatal(err)
		}
		nc := srv.Connect(t)
		if err := nc.Publish(subj, data); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	removals := us.Stats().Events.OfflineRemovals
	offline("eu")
	testutil.Eventually(t, "the client in us to drop eu's offline", func() bool { return us.Stats().Events.Dropped["other_region"] == 1 })
	testutil.Eventually(t, "the client without a region to apply eu's offline", func() bool {
		return anyRegion.Stats().Events.OfflineRemovals >= 1
	})
	if st := us.Stats().Events; st.OfflineRemovals != removals {
		t.Fatalf("eu's offline took an instance out of the client in us (offline removals %d, were %d)", st.OfflineRemovals, removals)
	}
	if ids := listed(t, us, "orders"); !slices.Equal(ids, []string{"orders-1"}) {
		t.Fatalf("the client in us lists %v after eu's offline, want its own orders-1", ids)
	}
	if d := anyRegion.Stats().Events.Dropped["other_region"]; d != 0 {
		t.Fatalf("a client without a region dropped %d events as of another region", d)
	}

	offline("us")
	testutil.Eventually(t, "the client in us to apply its own region's offline", func() bool {
		return us.Stats().Events.OfflineRemovals > removals
	})
}
