package serverlist_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/lbvisitor"
	"github.com/pushlb/pushlb/serverlist"
)

// TestBalancerKeepsTheMirrorsServers: a list applied through a Lookup
// over the mirror leaves the balancer holding the mirror's own servers,
// one copy of each instance; a change of what the balancer routes by
// gives it the mirror's new server (its statistics kept), and a change of
// the record that the balancer does not route by (a new owner and
// connection) keeps the server.
func TestBalancerKeepsTheMirrorsServers(t *testing.T) {
	e := newEnv(t, serverlist.RegistryConfig{})
	var ins []serverlist.Instance
	var ids []string
	for i := range 3 {
		in := inst("orders", fmt.Sprintf("orders-%d", i), 8080+i)
		ins = append(ins, in)
		ids = append(ids, in.InstanceID)
	}
	register(t, e.reg, ins...)
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	l, err := serverlist.NewLookup(e.reg, m, serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := balancer.New("orders", balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	v := lbvisitor.NewVisitor(b, l, lbvisitor.VisitorConfig{})
	apply := func(rev uint64) {
		t.Helper()
		if err := v.Apply(testCtx(t, 5*time.Second), events.ListChanged{Service: "orders", InstanceIDs: ids, Revision: rev}); err != nil {
			t.Fatal(err)
		}
	}
	mirrored := func(id string) *balancer.Server {
		t.Helper()
		s, ok := m.Server("orders", id)
		if !ok {
			t.Fatalf("the mirror holds no %s", id)
		}
		return s
	}
	waitMirror := func(rev uint64) {
		t.Helper()
		testutil.Eventually(t, "the mirror to apply the write", func() bool { return m.Stats().Revision >= rev })
	}

	apply(1)
	before := map[string]*balancer.Server{}
	for _, s := range b.AllServers() {
		if s != mirrored(s.ID) {
			t.Fatalf("%s: the balancer holds a copy, not the mirror's server", s.ID)
		}
		before[s.ID] = s
	}
	if len(before) != 3 {
		t.Fatalf("%d servers listed", len(before))
	}
	stats := b.Server("orders-0").Stats()

	// orders-0 gets another weight: a new server, the mirror's.
	changed := ins[0]
	changed.Weight = 300
	waitMirror(register(t, e.reg, changed))
	apply(2)
	s0 := b.Server("orders-0")
	if s0 == before["orders-0"] || s0 != mirrored("orders-0") || s0.Weight != 300 || s0.Stats() != stats {
		t.Fatalf("orders-0 after a change: a new server %v, the mirror's %v, weight %d, statistics kept %v",
			s0 != before["orders-0"], s0 == mirrored("orders-0"), s0.Weight, s0.Stats() == stats)
	}
	for _, id := range ids[1:] {
		if b.Server(id) != before[id] {
			t.Fatalf("%s changed without a change", id)
		}
	}

	// orders-1 gets an owner and a connection: the record changes, not
	// what the balancer routes by; the mirror keeps the server.
	owned := ins[1]
	owned.Owner, owned.NATSServerID, owned.NATSClientID = "0123456789abcdef01234567", "NSERVER", 7
	waitMirror(register(t, e.reg, owned))
	if in, _ := m.Get("orders", "orders-1"); in.Owner != owned.Owner || mirrored("orders-1") != before["orders-1"] {
		t.Fatalf("orders-1: owner %q, the same server %v", in.Owner, mirrored("orders-1") == before["orders-1"])
	}
	apply(3)
	if b.Server("orders-1") != before["orders-1"] {
		t.Fatal("orders-1: a new server for a change the balancer does not route by")
	}
}

// Without a mirror, ResolveServers reads each server and gives it to the
// caller as its own.
func TestResolveServersWithoutAMirror(t *testing.T) {
	e := newEnv(t, serverlist.RegistryConfig{})
	in := inst("orders", "orders-0", 8080)
	register(t, e.reg, in)
	l, err := serverlist.NewLookup(e.reg, nil, serverlist.LookupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	servers, errs := l.ResolveServers(testCtx(t, 5*time.Second), "orders", []string{"orders-0", "ghost"})
	if errs[0] != nil || servers[0] == nil || servers[0].Addr() != "127.0.0.1:8080" || servers[0].Metadata["version"] != "1" {
		t.Fatalf("orders-0: %+v, %v", servers[0], errs[0])
	}
	if servers[1] != nil || errs[1] == nil {
		t.Fatalf("ghost: %v, %v", servers[1], errs[1])
	}
}
