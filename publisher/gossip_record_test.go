package publisher_test

import (
	"testing"
	"time"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// TestRecordNamesTheGossipNode: with gossip, the registry entry names the
// instance's gossip node (its name and advertised address, as the other
// members see them), for the node of each incarnation; an empty BindAddr
// binds a free port.
func TestRecordNamesTheGossipNode(t *testing.T) {
	r := newRig(t, 5*time.Second)
	alive := make(chan gossip.Member, 16)
	gw, err := gossip.New(gossip.Config{BindAddr: "127.0.0.1:0", Profile: gossip.ProfileFast, Meta: gossip.Meta{Role: gossip.RoleGateway}},
		gossip.HandlerFuncs{Alive: func(m gossip.Member) { alive <- m }})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if err := gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	p, err := publisher.New(r.nc, r.reg, publisher.Config{Gossip: &gossip.Config{Join: []string{gw.LocalAddr()}, Profile: gossip.ProfileFast}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	in := serverlist.Instance{Service: "orders", InstanceID: "h:orders:9001", Host: "127.0.0.1", Port: 9001}
	for _, incarnation := range []int64{7, 8} {
		in.Incarnation = incarnation
		if err := p.Announce(t.Context(), in); err != nil {
			t.Fatal(err)
		}
		var m gossip.Member
		select {
		case m = <-alive:
		case <-time.After(10 * time.Second):
			t.Fatal("the gateway never saw the instance's node")
		}
		rec, err := r.reg.Get(t.Context(), "orders", in.InstanceID)
		if err != nil {
			t.Fatal(err)
		}
		if m.Meta.Incarnation != incarnation || rec.GossipNode != m.Name || rec.GossipAddr != m.Addr || rec.GossipAddr != p.GossipAddr() {
			t.Fatalf("incarnation %d: record names node %q at %q, the gateway sees %q at %q (incarnation %d), the publisher %q",
				incarnation, rec.GossipNode, rec.GossipAddr, m.Name, m.Addr, m.Meta.Incarnation, p.GossipAddr())
		}
		if got := p.Instance(); got.GossipNode != rec.GossipNode || got.GossipAddr != rec.GossipAddr {
			t.Fatalf("Instance() = %+v, the lease would re-put another record than %+v", got, rec)
		}
	}
}

// TestDownKeepsTheGossipNode: while down the instance stays the same
// gossip member (no leave and rejoin), and the record MarkUp writes names
// that node.
func TestDownKeepsTheGossipNode(t *testing.T) {
	r := newRig(t, 5*time.Second)
	gw, err := gossip.New(gossip.Config{BindAddr: "127.0.0.1:0", Profile: gossip.ProfileFast, Meta: gossip.Meta{Role: gossip.RoleGateway}}, gossip.HandlerFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if err := gw.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	p, err := publisher.New(r.nc, r.reg, publisher.Config{Gossip: &gossip.Config{Join: []string{gw.LocalAddr()}, Profile: gossip.ProfileFast}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	in := serverlist.Instance{Service: "orders", InstanceID: "h:orders:9001", Host: "127.0.0.1", Port: 9001, Incarnation: 7}
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	before, err := r.reg.Get(t.Context(), "orders", in.InstanceID)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.MarkDown(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	if p.GossipAddr() != before.GossipAddr {
		t.Fatalf("gossip node %q while down, want %q kept", p.GossipAddr(), before.GossipAddr)
	}
	if err := p.MarkUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	after, err := r.reg.Get(t.Context(), "orders", in.InstanceID)
	if err != nil {
		t.Fatal(err)
	}
	if after.GossipNode != before.GossipNode || after.GossipAddr != before.GossipAddr || after.Incarnation != 7 {
		t.Fatalf("record after MarkUp %+v, want node %q at %q and incarnation 7", after, before.GossipNode, before.GossipAddr)
	}
}
