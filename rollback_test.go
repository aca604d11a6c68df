package pushlb_test

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// listedIDs returns the IDs service's balancer lists, sorted.
func listedIDs(c *pushlb.Client, service string) []string {
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

// logOnFailure prints the client's log when the test fails.
func logOnFailure(t *testing.T, logs *testutil.SyncBuffer) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the client's log:\n%s", logs.String())
		}
	})
}

// TestRegistryGoesBackInTime: the NATS server comes back with its store
// as it was a moment ago (a power loss before the latest writes reached
// the disk): the registry lost a withdrawal and an announcement. The
// client neither routes the withdrawn instance again, whose old record
// the registry holds again, nor leaves the announced one out, whose
// publisher writes its record back; it counts the bucket gone back.
func TestRegistryGoesBackInTime(t *testing.T) {
	srv := natstest.Start(t)
	var logs testutil.SyncBuffer
	logOnFailure(t, &logs)
	c := startWith(t, srv.Connect(t), pushlb.Config{Follow: pushlb.FollowAll}, pushlb.WithLogger(zerolog.New(&logs)))
	ba, bb, bc := testpub.Backend(t, "a"), testpub.Backend(t, "b"), testpub.Backend(t, "c")
	announce(t, srv, "orders", "", ba)
	pb := announce(t, srv, "orders", "", bb)
	testutil.Eventually(t, "a and b listed", func() bool { return len(listedIDs(c, "orders")) == 2 })

	syncs := c.Stats().Registry.Syncs
	dir := srv.CopyStore(t)
	testutil.Eventually(t, "the client resynced", func() bool { return c.Stats().Registry.Syncs > syncs })

	if err := pb.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	announce(t, srv, "orders", "", bc)
	want := []string{ba.URL, bc.URL}
	slices.Sort(want)
	testutil.Eventually(t, "a and c listed", func() bool { return slices.Equal(listedIDs(c, "orders"), want) })

	syncs = c.Stats().Registry.Syncs
	srv.RestartWithStore(t, dir)
	testutil.Eventually(t, "the client resynced", func() bool { return c.Stats().Registry.Syncs > syncs })
	testutil.Eventually(t, "a and c listed", func() bool { return slices.Equal(listedIDs(c, "orders"), want) })
	if n := c.Stats().Registry.WentBack; n != 1 {
		t.Fatalf("the bucket counted gone back %d times, want 1", n)
	}
}

// storeRollback is a deployment whose stores can be brought back to an
// earlier state: connect connects a client, snapshot copies the stores
// and returns what brings them back.
type storeRollback struct {
	name     string
	start    func(t *testing.T) (connect func(t *testing.T) *nats.Conn, snapshot func(t *testing.T) (restore func(t *testing.T)))
	replicas int
}

var rollbacks = []storeRollback{
	{name: "one server", replicas: 1, start: func(t *testing.T) (func(*testing.T) *nats.Conn, func(*testing.T) func(*testing.T)) {
		srv := natstest.Start(t)
		return func(t *testing.T) *nats.Conn { return srv.Connect(t) }, func(t *testing.T) func(*testing.T) {
			dir := srv.CopyStore(t)
			return func(t *testing.T) { srv.RestartWithStore(t, dir) }
		}
	}},
	{name: "three nodes", replicas: 3, start: func(t *testing.T) (func(*testing.T) *nats.Conn, func(*testing.T) func(*testing.T)) {
		c := natstest.StartCluster(t, 3)
		return func(t *testing.T) *nats.Conn { return c.Connect(t) }, func(t *testing.T) func(*testing.T) {
			dirs := c.CopyStores(t)
			return func(t *testing.T) { c.RestartWithStores(t, dirs) }
		}
	}},
}

// TestRegistryGoesBackInTimeDownUp: an instance went down and up a few
// times, writes the registry then lost (one server, or every node of a
// cluster, came back as it was before them: a coordinated power loss).
// Its next down and up, whose writes reuse the lost revisions, are
// applied: the up is ordered after the down, not taken for older than the
// writes the client saw, which would leave a live instance unrouted.
func TestRegistryGoesBackInTimeDownUp(t *testing.T) {
	for _, rb := range rollbacks {
		t.Run(rb.name, func(t *testing.T) {
			connect, snapshot := rb.start(t)
			var logs testutil.SyncBuffer
			logOnFailure(t, &logs)
			c := startWith(t, connect(t), pushlb.Config{Follow: pushlb.FollowAll, RegistryReplicas: rb.replicas}, pushlb.WithLogger(zerolog.New(&logs)))
			ba, bf := testpub.Backend(t, "a"), testpub.Backend(t, "f")
			testpub.Announce(t, connect(t), "orders", "", ba)
			pf := testpub.Announce(t, connect(t), "orders", "", bf)
			both := []string{ba.URL, bf.URL}
			slices.Sort(both)
			testutil.Eventually(t, "a and f listed", func() bool { return slices.Equal(listedIDs(c, "orders"), both) })
			downUp := func(what string) {
				t.Helper()
				if err := pf.MarkDown(t.Context(), "test"); err != nil {
					t.Fatal(err)
				}
				testutil.Eventually(t, "f down "+what, func() bool { return len(listedIDs(c, "orders")) == 1 })
				if err := pf.MarkUp(t.Context()); err != nil {
					t.Fatal(err)
				}
				testutil.Eventually(t, "f up "+what, func() bool { return slices.Equal(listedIDs(c, "orders"), both) })
			}

			syncs := c.Stats().Registry.Syncs
			restore := snapshot(t)
			testutil.Eventually(t, "the client resynced", func() bool { return c.Stats().Registry.Syncs > syncs })
			testutil.Eventually(t, "a and f listed", func() bool { return slices.Equal(listedIDs(c, "orders"), both) })
			for range 3 {
				downUp("before the rollback") // writes the rollback loses
			}
			syncs = c.Stats().Registry.Syncs
			restore(t)
			testutil.Eventually(t, "the client resynced", func() bool { return c.Stats().Registry.Syncs > syncs })
			testutil.Eventually(t, "a and f listed", func() bool { return slices.Equal(listedIDs(c, "orders"), both) })
			downUp("after the rollback")
			if n := c.Stats().Registry.WentBack; n == 0 {
				t.Fatal("the bucket's going back was not counted")
			}
		})
	}
}
