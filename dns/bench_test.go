package dns_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/dns"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// BenchmarkWithdrawalToDNSAnswer measures how soon a DNS asker sees a
// withdrawal: an instance is announced, a client querying A in a loop (an
// in-process UDP client, one query at a time) waits for it, then it is
// withdrawn. Per withdrawal:
//   - applied→answer: from the client applying the list without it
//     (pushlb.ListChange.At) to the first answer without it;
//   - publish→answer: from the offline event's publication (its At) to
//     the same answer;
//   - nats-hop: from the publication to its delivery to a plain NATS
//     subscriber of the same process, the floor of the push path;
//   - query-rtt: the round trip of the asker's queries meanwhile. The
//     responder reads the client's list at every query, so applied→answer
//     is at most the query in flight when the list changes plus one more.
//
// go test -run '^$' -bench WithdrawalToDNSAnswer -benchtime 300x ./dns
func BenchmarkWithdrawalToDNSAnswer(b *testing.B) {
	srv := natstest.Start(b)
	type stamp struct {
		id string
		at time.Time
	}
	applied := make(chan stamp, 64) // when a withdrawn instance left the list
	c := startClient(b, srv, pushlb.Config{Coalesce: time.Nanosecond}, pushlb.WithListObserver(func(lc pushlb.ListChange) {
		for _, l := range lc.Left {
			if strings.HasPrefix(l.Server.ID, "leaves-") {
				applied <- stamp{l.Server.ID, lc.At}
			}
		}
	}))
	s := startServer(b, dns.ClientSource(c), dns.Config{})
	hops := make(chan [2]stamp, 64) // an offline event's publication and delivery
	sub, err := srv.Connect(b).Subscribe(events.Subject(events.DefaultPrefix, "orders", events.Offline), func(m *nats.Msg) {
		now := time.Now()
		if e, err := events.Decode(m.Data); err == nil {
			hops <- [2]stamp{{e.InstanceID, e.At}, {e.InstanceID, now}}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	announceAt(b, srv, "127.0.0.1:9000", serverlist.Instance{Service: "orders", InstanceID: "stays"})

	conn, err := mdns.Dial("udp", s.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	q := new(mdns.Msg)
	q.SetQuestion("orders.service.pushlb.", mdns.TypeA)
	// holds asks once and reports whether the answer holds addr.
	holds := func(addr netip.Addr) bool {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if err := conn.WriteMsg(q); err != nil {
			b.Fatal(err)
		}
		m, err := conn.ReadMsg()
		if err != nil {
			b.Fatal(err)
		}
		for _, rr := range m.Answer {
			if a, ok := rr.(*mdns.A); ok && a.A.String() == addr.String() {
				return true
			}
		}
		return false
	}

	var toAnswer, fromPublish, hop []time.Duration
	var rtts []time.Duration // the asker's queries while it waits: the bound of applied→answer
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		addr := netip.AddrFrom4([4]byte{127, 1, byte(i / 250), byte(i%250 + 1)})
		p := announceAt(b, srv, netip.AddrPortFrom(addr, 9001).String(), serverlist.Instance{Service: "orders", InstanceID: fmt.Sprint("leaves-", i)})
		deadline := time.Now().Add(testutil.DefaultTimeout)
		for !holds(addr) {
			if time.Now().After(deadline) {
				b.Fatalf("%v never answered", addr)
			}
		}
		// The asker queries in a loop from before the withdrawal until an
		// answer leaves addr out.
		seen := make(chan time.Time, 1)
		go func() {
			for {
				began := time.Now()
				held := holds(addr)
				rtts = append(rtts, time.Since(began))
				if !held {
					break
				}
			}
			seen <- time.Now()
		}()
		b.StartTimer()
		if err := p.Withdraw(context.Background(), "bench"); err != nil {
			b.Fatal(err)
		}
		answered := testutil.Receive(b, seen, testutil.DefaultTimeout, "an answer without the withdrawn instance")
		id := p.Instance().InstanceID
		var at stamp
		for at.id != id { // an earlier withdrawal may be told again (a record's removal after the event)
			at = testutil.Receive(b, applied, testutil.DefaultTimeout, "the withdrawal applied")
		}
		var h [2]stamp
		for h[0].id != id {
			h = testutil.Receive(b, hops, testutil.DefaultTimeout, "the offline event over NATS")
		}
		toAnswer = append(toAnswer, answered.Sub(at.at))
		fromPublish = append(fromPublish, answered.Sub(h[0].at))
		hop = append(hop, h[1].at.Sub(h[0].at))
		p.Close()
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"applied→answer", toAnswer}, {"publish→answer", fromPublish}, {"nats-hop", hop}, {"query-rtt", rtts}} {
		b.ReportMetric(float64(testutil.Percentile(m.d, 0.50).Microseconds()), m.name+"-p50-µs")
		b.ReportMetric(float64(testutil.Percentile(m.d, 0.99).Microseconds()), m.name+"-p99-µs")
	}
}

// BenchmarkAnswer is the cost of one answer over UDP, from a client's
// query to its reply, for a service of 10 instances from a client's pushed
// list, beside a static list (dns.Static) answered by the same code.
//
// go test -run '^$' -bench 'Answer$' ./dns
func BenchmarkAnswer(b *testing.B) {
	srv := natstest.Start(b)
	c := startClient(b, srv, pushlb.Config{})
	for i := range 10 {
		announceAt(b, srv, fmt.Sprintf("127.0.0.%d:9000", i+1), serverlist.Instance{Service: "orders", InstanceID: fmt.Sprint(i)})
	}
	pushed := startServer(b, dns.ClientSource(c), dns.Config{})
	static := startServer(b, staticOf(b, c), dns.Config{})
	for _, bc := range []struct {
		name string
		s    *dns.Server
	}{{"pushed", pushed}, {"static", static}} {
		b.Run(bc.name, func(b *testing.B) {
			conn, err := mdns.Dial("udp", bc.s.Addr())
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			q := new(mdns.Msg)
			q.SetQuestion("orders.service.pushlb.", mdns.TypeA)
			for b.Loop() {
				if err := conn.WriteMsg(q); err != nil {
					b.Fatal(err)
				}
				m, err := conn.ReadMsg()
				if err != nil || len(m.Answer) != 10 {
					b.Fatalf("%v %v", m, err)
				}
			}
		})
	}
}

// staticOf waits for c's list of orders to hold 10 servers and returns a
// Static of it.
func staticOf(b *testing.B, c *pushlb.Client) dns.Static {
	var st dns.Static
	testutil.Eventually(b, "10 instances of orders", func() bool {
		bal, err := c.Follow(context.Background(), "orders")
		if err != nil || len(bal.Reachable()) != 10 {
			return false
		}
		st = dns.Static{"orders": bal.Reachable()}
		return true
	})
	return st
}
