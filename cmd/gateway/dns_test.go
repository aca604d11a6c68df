package main

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// lookup asks the responder at addr for name over network and returns the
// rcode and the answer's records as "A 127.0.0.1" or "SRV 1 100 9001",
// sorted.
func lookup(addr, network, name string, qtype uint16) (int, []string, error) {
	q := new(mdns.Msg)
	q.SetQuestion(name, qtype)
	m, _, err := (&mdns.Client{Net: network, Timeout: 5 * time.Second}).Exchange(q, addr)
	if err != nil {
		return 0, nil, err
	}
	var out []string
	for _, rr := range m.Answer {
		switch rr := rr.(type) {
		case *mdns.A:
			out = append(out, "A "+rr.A.String())
		case *mdns.SRV:
			out = append(out, fmt.Sprintf("SRV %d %d %d", rr.Priority, rr.Weight, rr.Port))
		}
	}
	slices.Sort(out)
	return m.Rcode, out, nil
}

// The gateway binary with -dns, following on request (its default): a
// query follows a service announced by the announce binary; an instance
// that stops (announce withdraws it on SIGTERM) leaves the answer; an
// unknown name is NXDOMAIN; the answers are counted on /metrics.
func TestGatewayDNS(t *testing.T) {
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
	dnsAddr := testutil.FreeAddr(t)
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats,
		"-data-dir", t.TempDir(), "-zone", "a", "-dns", dnsAddr)
	g.WaitFor(t, "dns responder started", lineTimeout)
	g.waitHealthy(t)

	b1, b2 := named(t, "b1"), named(t, "b2")
	addr1, addr2 := strings.TrimPrefix(b1.URL, "http://"), strings.TrimPrefix(b2.URL, "http://")
	_, port1, _ := strings.Cut(addr1, ":")
	_, port2, _ := strings.Cut(addr2, ":")
	announceHold(t, g, "orders", addr1, "-zone", "a", "-weight", "300").WaitFor(t, "announced", lineTimeout)
	a2 := announceHold(t, g, "orders", addr2, "-zone", "b")
	a2.WaitFor(t, "announced", lineTimeout)

	// The first query follows orders; A answers the instance of the
	// gateway's zone (a), a zone label another zone's.
	rcode, got, err := lookup(dnsAddr, "udp", "orders.service.pushlb.", mdns.TypeA)
	if err != nil || rcode != mdns.RcodeSuccess || !slices.Equal(got, []string{"A 127.0.0.1"}) {
		t.Fatalf("first query: %s %v %v", mdns.RcodeToString[rcode], got, err)
	}
	want := []string{"SRV 1 300 " + port1, "SRV 2 100 " + port2}
	slices.Sort(want)
	if _, got, err := lookup(dnsAddr, "tcp", "_orders._tcp.service.pushlb.", mdns.TypeSRV); err != nil || !slices.Equal(got, want) {
		t.Fatalf("SRV over TCP: %v %v, want %v (priority 1 in the gateway's zone a)", got, err, want)
	}

	a2.Signal(t, syscall.SIGTERM) // announce withdraws it, then exits
	testutil.Eventually(t, "the withdrawn instance to leave the SRV answer", func() bool {
		_, got, err := lookup(dnsAddr, "udp", "_orders._tcp.service.pushlb.", mdns.TypeSRV)
		return err == nil && slices.Equal(got, []string{"SRV 1 300 " + port1})
	})
	if rcode, _, err := lookup(dnsAddr, "udp", "nobody.service.pushlb.", mdns.TypeA); err != nil || rcode != mdns.RcodeNameError {
		t.Errorf("unknown service: %s %v", mdns.RcodeToString[rcode], err)
	}
	if n := g.metric(`pushlb_dns_answers_total{result="nxdomain"}`); n != 1 {
		t.Errorf(`pushlb_dns_answers_total{result="nxdomain"} = %v, want 1`, n)
	}
	if n := g.metric(`pushlb_dns_answers_total{result="answered"}`); n < 3 {
		t.Errorf(`pushlb_dns_answers_total{result="answered"} = %v, want 3 or more`, n)
	}
	g.Signal(t, syscall.SIGTERM)
	if code := g.Wait(t, exitTimeout); code != 0 {
		t.Errorf("gateway exit code %d", code)
	}
}
