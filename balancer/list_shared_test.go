package balancer

import (
	"context"
	"sync"
	"testing"
)

// pointers returns list's servers as pointers of their own.
func pointers(list []Server) []*Server {
	out := make([]*Server, len(list))
	for i := range list {
		s := list[i]
		out[i] = &s
	}
	return out
}

// SetServersShared keeps the caller's servers as its copies: one copy of
// each instance, the caller's.
func TestSetServersSharedKeepsTheCallersServers(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, nil)
	given := pointers(servers(3, "z1", 0))
	if err := tb.SetServersShared(given); err != nil {
		t.Fatal(err)
	}
	for i, s := range tb.AllServers() {
		if s != given[i] {
			t.Fatalf("server %d is a copy, want the caller's", i)
		}
		if s.Addr() != given[i].Host+":8080" || !s.Alive() {
			t.Fatalf("server %d: %s, alive %v", i, s.Addr(), s.Alive())
		}
	}
	p, err := tb.Pick(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p.Done(DoneInfo{})
	stats := p.Server.Stats()

	// The next list: the same servers, the picked one with new details
	// as a new server. Its statistics stay; the others are kept as they
	// are.
	next := append([]*Server(nil), given...)
	for i, s := range given {
		if s == p.Server {
			c := Server{ID: s.ID, Host: s.Host, Port: s.Port, Zone: s.Zone, Weight: 300}
			next[i] = &c
		}
	}
	if err := tb.SetServersShared(next); err != nil {
		t.Fatal(err)
	}
	for i, s := range tb.AllServers() {
		if s != next[i] {
			t.Fatalf("server %d after the change is not the caller's", i)
		}
	}
	if got := tb.Server(p.Server.ID); got.Weight != 300 || got.Stats() != stats || got.Stats().Requests() != 1 {
		t.Fatalf("changed server: weight %d, its statistics kept: %v", got.Weight, got.Stats() == stats)
	}
}

// A server another balancer holds, or one this balancer listed before,
// is copied: its state (statistics, alive) stays with the snapshots that
// hold it.
func TestSetServersSharedCopiesWhatIsNotItsOwn(t *testing.T) {
	a := newTest(t, nil, nil)
	b := newTest(t, nil, nil)
	given := pointers(servers(2, "", 0))
	if err := a.SetServersShared(given); err != nil {
		t.Fatal(err)
	}
	if err := b.SetServersShared(given); err != nil {
		t.Fatal(err)
	}
	for i, s := range b.AllServers() {
		if s == given[i] || s.inst == given[i].inst {
			t.Fatalf("server %d: another balancer's server taken, not copied", i)
		}
	}
	if a.AllServers()[0] != given[0] {
		t.Fatal("the first balancer lost its server")
	}

	// s0 goes down and out of the list, then comes back as the same
	// server: it starts alive, as a server new to a list does.
	a.MarkServerDown("s0")
	if err := a.SetServersShared(given[1:]); err != nil {
		t.Fatal(err)
	}
	if err := a.SetServersShared(given); err != nil {
		t.Fatal(err)
	}
	back := a.Server("s0")
	if back == given[0] || !back.Alive() {
		t.Fatalf("s0 back: the old server %v, alive %v", back == given[0], back.Alive())
	}
	if given[0].Alive() {
		t.Fatal("the old server's state changed")
	}
}

func TestSetServersSharedRefusesInvalidServers(t *testing.T) {
	tb := newTest(t, nil, servers(1, "", 0))
	bad := &Server{ID: "bad", Host: "10.0.0.9", Port: 0}
	good := pointers(servers(1, "", 5))
	err := tb.SetServersShared([]*Server{bad, nil, good[0]})
	if err == nil {
		t.Fatal("no error for an invalid and a nil server")
	}
	if all := tb.AllServers(); len(all) != 1 || all[0] != good[0] {
		t.Fatalf("list %v, want the valid server alone", all)
	}
	if err := tb.SetServersShared([]*Server{bad}); err == nil || len(tb.AllServers()) != 1 {
		t.Fatalf("a list of invalid servers: %v, %d servers (want the list kept)", err, len(tb.AllServers()))
	}
}

// Picks and Done run while lists of shared servers change (-race).
func TestSetServersSharedUnderPicks(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, nil)
	lists := [][]*Server{pointers(servers(4, "z1", 0)), pointers(servers(4, "z1", 2))}
	if err := tb.SetServersShared(lists[0]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				p, err := tb.Pick(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				_ = p.Server.Addr()
				p.Done(DoneInfo{})
			}
		}()
	}
	for i := range 200 {
		if err := tb.SetServersShared(lists[i%2]); err != nil {
			t.Error(err)
		}
	}
	cancel()
	wg.Wait()
}
