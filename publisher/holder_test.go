package publisher_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// listen accepts connections on a free loopback port, as a live instance
// does, until the test ends, and returns the address.
func listen(t *testing.T) (host string, port int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	a := ln.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port
}

// freeLoopback returns a loopback address where nothing listens.
func freeLoopback(t *testing.T) (host string, port int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr)
	ln.Close()
	return a.IP.String(), a.Port
}

// TestLiveHolderRefusedByItsProbe: a publisher claiming an ID whose holder
// answers at its address is refused at once with ErrInUse, though the
// holder's lease (an hour long) is never renewed during the test and the
// claim's watch would last half an hour. The record and the lease stay as
// they were.
func TestLiveHolderRefusedByItsProbe(t *testing.T) {
	r := newRig(t, time.Hour)
	in := serverlist.Instance{Service: "orders", InstanceID: "shared", Zone: "a"}
	in.Host, in.Port = listen(t)
	orig := newPublisher(t, r, publisher.Config{})
	if err := orig.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	r.next(t)
	lease, err := r.reg.LeaseRevision(t.Context(), "orders", "shared")
	if err != nil {
		t.Fatal(err)
	}
	dup := newPublisher(t, r, publisher.Config{})
	other := in
	other.Host, other.Port = listen(t)
	err = dup.Announce(bounded(t), other)
	if !errors.Is(err, serverlist.ErrInUse) || !strings.Contains(err.Error(), "answers") {
		t.Fatalf("duplicate Announce = %v, want ErrInUse: the holder answers", err)
	}
	t.Logf("refused: %v", err)
	if owner, port := holder(t, r, "shared"); owner != orig.Owner() || port != in.Port {
		t.Fatalf("record held by %q port %d, want the original's", owner, port)
	}
	if rev, err := r.reg.LeaseRevision(t.Context(), "orders", "shared"); err != nil || rev != lease {
		t.Fatalf("lease revision %d, %v; want %d, never renewed", rev, err, lease)
	}
}

// TestHolderProbedAtItsGossipNode: the holder's record names its gossip
// node, which answers though nothing listens at its service address: the
// claim is refused at once.
func TestHolderProbedAtItsGossipNode(t *testing.T) {
	r := newRig(t, time.Hour)
	in := serverlist.Instance{Service: "orders", InstanceID: "gossiping", Zone: "a"}
	in.Host, in.Port = freeLoopback(t)
	orig := newPublisher(t, r, publisher.Config{Gossip: &gossip.Config{BindAddr: "127.0.0.1:0"}})
	if err := orig.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	dup := newPublisher(t, r, publisher.Config{})
	other := in
	other.Host, other.Port = listen(t)
	if err := dup.Announce(bounded(t), other); !errors.Is(err, serverlist.ErrInUse) {
		t.Fatalf("duplicate Announce = %v, want ErrInUse: the holder's gossip node answers", err)
	}
}

// TestClaimDoesNotProbeItsOwnAddress: a restart on the same address, whose
// own listener is up, finds the crashed predecessor's record naming that
// address. The answer there may be its own, so it does not refuse: it
// watches the record (ClaimProbe), which is not renewed, and takes the ID
// over.
func TestClaimDoesNotProbeItsOwnAddress(t *testing.T) {
	r := newRig(t, time.Hour)
	in := serverlist.Instance{Service: "orders", InstanceID: "restarted", Zone: "a"}
	in.Host, in.Port = listen(t)
	crashed := newPublisher(t, r, publisher.Config{})
	if err := crashed.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	crashed.Close() // no withdrawal: the record and its lease stay
	watched := make(chan struct{}, 1)
	restart := newPublisher(t, r, publisher.Config{ClaimProbe: 300 * time.Millisecond,
		OnClaimWait: func(serverlist.Instance, time.Duration) { watched <- struct{}{} }})
	in.Incarnation = time.Now().UnixNano()
	if err := restart.Announce(t.Context(), in); err != nil {
		t.Fatalf("the restart on its own address: %v, want a takeover after the watch", err)
	}
	select {
	case <-watched:
	default:
		t.Fatal("the restart took the ID over without watching the record")
	}
	if owner, _ := holder(t, r, "restarted"); owner != restart.Owner() {
		t.Fatalf("record held by %q, want the restart's", owner)
	}
	if restart.ClaimWait() != 300*time.Millisecond || crashed.ClaimWait() != 30*time.Minute {
		t.Fatalf("ClaimWait = %v and %v, want ClaimProbe and half the TTL", restart.ClaimWait(), crashed.ClaimWait())
	}
}

// holder reads the record of orders' instance id: its owner and port.
func holder(t *testing.T, r *rig, id string) (owner string, port int) {
	t.Helper()
	in, err := r.reg.Get(t.Context(), "orders", id)
	if err != nil {
		t.Fatal(err)
	}
	return in.Owner, in.Port
}

// bounded is a context for a claim that must not watch (half an hour with
// the tests' one-hour lease): a regression fails, it does not hang.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
