package serverlist_test

import (
	"slices"
	"testing"
	"time"

	"github.com/pushlb/pushlb/serverlist"
)

// TestMirrorByConnection: the mirror finds the records a NATS connection
// holds, follows a record that moves to another connection (a publisher
// that reconnected) or goes, and builds the same index from a first sync.
func TestMirrorByConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	c1 := serverlist.Connection{ServerID: "NSERVER1", ClientID: 7}
	c2 := serverlist.Connection{ServerID: "NSERVER1", ClientID: 8}
	c3 := serverlist.Connection{ServerID: "NSERVER2", ClientID: 7} // the same client ID on another server
	on := func(in serverlist.Instance, c serverlist.Connection) serverlist.Instance {
		in.NATSServerID, in.NATSClientID = c.ServerID, c.ClientID
		return in
	}
	a1 := on(inst("orders", "a1", 9001), c1)
	a2 := on(inst("orders", "a2", 9002), c1) // one process, two instances, one connection
	b1 := on(inst("billing", "b1", 7001), c2)
	plain := inst("orders", "plain", 9003)
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	waitApplied(t, m, register(t, e.reg, a1, a2, b1, plain))

	ids := func(m *serverlist.Mirror, c serverlist.Connection) []string {
		var out []string
		for _, e := range m.ByConnection(c) {
			out = append(out, e.Service+"/"+e.InstanceID)
		}
		return out
	}
	check := func(m *serverlist.Mirror, c serverlist.Connection, want ...string) {
		t.Helper()
		if got := ids(m, c); !slices.Equal(got, want) {
			t.Fatalf("ByConnection(%v) = %v, want %v", c, got, want)
		}
	}
	check(m, c1, "orders/a1", "orders/a2")
	check(m, c2, "billing/b1")
	check(m, c3)
	check(m, serverlist.Connection{}) // names none: not the records without a connection

	// a1 reconnected to another server and rewrote its record.
	waitApplied(t, m, register(t, e.reg, on(a1, c3)))
	check(m, c1, "orders/a2")
	check(m, c3, "orders/a1")

	// A first sync builds the same index.
	fresh := startMirror(t, e.reg, serverlist.MirrorConfig{})
	check(fresh, c1, "orders/a2")
	check(fresh, c3, "orders/a1")
	check(fresh, c2, "billing/b1")

	// Removed records leave it.
	ctx := testCtx(t, 5*time.Second)
	if err := e.reg.Deregister(ctx, "orders", "a2"); err != nil {
		t.Fatal(err)
	}
	rev := register(t, e.reg, plain) // a later write, to wait for
	waitApplied(t, m, rev)
	check(m, c1)
	if got := m.ByConnection(c3); len(got) != 1 || got[0].Revision == 0 || !got[0].Equal(on(a1, c3)) {
		t.Fatalf("ByConnection(c3) = %+v", got)
	}
}
