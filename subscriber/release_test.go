package subscriber_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// leadingReaper starts a reaper over the rig's registry, waits until it
// leads and gives it to the gateway's subscriber.
func (r *advisoryRig) leadingReaper(t *testing.T) *serverlist.Reaper {
	t.Helper()
	rp := serverlist.NewReaper(r.g.reg, serverlist.ReaperConfig{Node: "gateway"})
	if err := rp.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.Close() })
	testutil.Eventually(t, "the reaper to lead", rp.Leader)
	r.g.sub.UseReleaser(rp)
	return rp
}

// announceNamed announces instance i of service, which the gateway does
// not follow, over a connection named name.
func (r *advisoryRig) announceNamed(t *testing.T, service string, i int, name string) *served {
	t.Helper()
	return r.announceOf(t, service, i, false, nats.Name(name))
}

// registered returns the registry's record of in, read from the bucket.
func (r *advisoryRig) registered(t *testing.T, in serverlist.Instance) (serverlist.Entry, bool) {
	t.Helper()
	e, err := r.g.reg.GetEntry(t.Context(), in.Service, in.InstanceID)
	if errors.Is(err, serverlist.ErrNotFound) {
		return e, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return e, true
}

// TestReleaseFreesACrashedInstancesID: the instance's process dies; the
// advisory's probe finds it dead, and the leading reaper frees its ID:
// its lease and its record are gone from the registry at once, long
// before the lease would end, so that its restart claims the ID without
// waiting.
func TestReleaseFreesACrashedInstancesID(t *testing.T) {
	r := newAdvisoryRig(t)
	r.leadingReaper(t)
	crashed := r.announce(t, 1)
	kept := r.announce(t, 2)

	crashed.srv.Close()
	crashed.nc.Close()
	testutil.Eventually(t, "the ID released", func() bool {
		return r.g.sub.Stats().Advisories.Releases["released"] == 1
	})
	if _, ok := r.registered(t, crashed.in); ok {
		t.Fatal("the crashed instance's record is still registered")
	}
	if _, err := r.g.reg.LeaseRevision(t.Context(), "orders", crashed.in.InstanceID); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("the crashed instance's lease: %v, want not found", err)
	}
	if _, ok := r.registered(t, kept.in); !ok {
		t.Fatal("the live instance's record went")
	}
}

// TestReleaseRacesAReconnectingHolder: a live holder whose address
// refuses connects (its probe fails: what a probe cannot tell from a
// crash) has its NATS connection closed by the server, and reconnects at
// once. The reaper's release and the holder's rewrite of its record with
// its new connection race: whichever comes first, the holder keeps its
// ID (its record, its owner, its new connection), as a holder re-asserts a
// record it lost. Repeated, so that both orders are likely to happen.
func TestReleaseRacesAReconnectingHolder(t *testing.T) {
	r := newAdvisoryRig(t)
	r.leadingReaper(t)
	s := r.announce(t, 1)
	s.srv.Close() // every probe of it is refused
	owner := s.pub.Instance().Owner
	const blips = 5
	for i := range blips {
		var old serverlist.Connection
		testutil.Eventually(t, "the record to name the current connection", func() bool {
			e, ok := r.registered(t, s.in)
			id, err := s.nc.GetClientID()
			old = e.Connection()
			return ok && err == nil && old.ClientID == id && s.nc.Status() == nats.CONNECTED
		})
		probes := r.g.sub.Stats().Advisories.Probes["refused"]
		if err := r.srv.NATS().DisconnectClientByID(old.ClientID); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the probe to end", func() bool { return r.g.sub.Stats().Advisories.Probes["refused"] > probes })
		testutil.Eventually(t, "the holder's record back, naming its new connection", func() bool {
			e, ok := r.registered(t, s.in)
			return ok && e.Owner == owner && e.Connection() != old && !e.Connection().IsZero()
		})
		testutil.Eventually(t, "the release decided", func() bool {
			st := r.g.sub.Stats().Advisories.Releases
			return st["released"]+st["renamed"]+st["renewed"]+st["failed"] == uint64(i+1)
		})
	}
	st := r.g.sub.Stats().Advisories.Releases
	t.Logf("%d blips: releases %v", blips, st)
	if st["failed"] != 0 {
		t.Fatalf("releases %v: some failed", st)
	}
}

// TestReleaseOfAnUnfollowedAnnouncer: the reaper's leader follows orders
// only. An instance of billing whose connection bears announce's name
// crashes: the leader reads its record by that name, probes it and frees
// its ID, without listing it. One whose connection bears another name is
// left to its lease.
func TestReleaseOfAnUnfollowedAnnouncer(t *testing.T) {
	r := newAdvisoryRigWith(t, subscriber.Config{Services: []string{"orders"}})
	r.leadingReaper(t)
	named := r.announceNamed(t, "billing", 1, events.AnnouncerName("billing", instance("billing", 1, 0).InstanceID))
	anonymous := r.announceNamed(t, "billing", 2, "some program")

	received := r.g.sub.Stats().Advisories.Received
	anonymous.srv.Close()
	anonymous.nc.Close()
	testutil.Eventually(t, "the anonymous connection's advisory handled", func() bool { return r.g.sub.Stats().Advisories.Received > received })
	named.srv.Close()
	named.nc.Close()
	testutil.Eventually(t, "the named announcer's ID released", func() bool {
		return r.g.sub.Stats().Advisories.Releases["released"] == 1
	})
	if _, ok := r.registered(t, named.in); ok {
		t.Fatal("the named announcer's record is still registered")
	}
	if _, ok := r.registered(t, anonymous.in); !ok {
		t.Fatal("the record of a connection without announce's name went")
	}
	if st := r.g.sub.Stats().Advisories; st.Matched != 0 || st.Removals != 0 {
		t.Fatalf("advisory stats %+v: an unfollowed service's instance was matched or removed", st)
	}
}
