package dns_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/dns"
)

// startServer starts a responder over src on a free loopback port, closed
// by the test's cleanup.
func startServer(t testing.TB, src dns.Source, cfg dns.Config) *dns.Server {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	s, err := dns.New(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

// ask sends one query over net ("udp" or "tcp") and returns the answer.
func ask(t testing.TB, addr, network, name string, qtype uint16) *mdns.Msg {
	t.Helper()
	m, err := exchange(addr, network, name, qtype, 0)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, mdns.TypeToString[qtype], network, err)
	}
	return m
}

// exchange sends one query, with EDNS(0) offering edns bytes when edns > 0.
func exchange(addr, network, name string, qtype uint16, edns uint16) (*mdns.Msg, error) {
	q := new(mdns.Msg)
	q.SetQuestion(mdns.Fqdn(name), qtype)
	if edns > 0 {
		q.SetEdns0(edns, false)
	}
	c := &mdns.Client{Net: network, Timeout: 5 * time.Second}
	m, _, err := c.Exchange(q, addr)
	return m, err
}

func orders() dns.Static {
	return dns.NewStatic(map[string][]balancer.Server{
		"orders": {
			{ID: "a1", Host: "10.0.0.1", Port: 9001, Zone: "a", Weight: 300},
			{ID: "a2", Host: "10.0.0.2", Port: 9002, Zone: "a"},
			{ID: "b1", Host: "10.0.0.3", Port: 9003, Zone: "b", Weight: 50},
			{ID: "b6", Host: "fd00::3", Port: 9004, Zone: "b"},
			{ID: "named", Host: "orders-7.internal.example", Port: 9005, Zone: "b"},
		},
		"empty": {},
	})
}

func addrs(m *mdns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch rr := rr.(type) {
		case *mdns.A:
			out = append(out, rr.A.String())
		case *mdns.AAAA:
			out = append(out, rr.AAAA.String())
		}
	}
	slices.Sort(out)
	return out
}

func TestAnswers(t *testing.T) {
	s := startServer(t, orders(), dns.Config{})
	cases := []struct {
		name   string
		qtype  uint16
		rcode  int
		want   []string // the addresses answered, sorted
		answer int      // records in the answer, when no addresses are listed
		auth   bool     // the answer is authoritative
	}{
		{"orders.service.pushlb.", mdns.TypeA, mdns.RcodeSuccess, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, 0, true},
		{"ORDERS.Service.PushLB.", mdns.TypeA, mdns.RcodeSuccess, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, 0, true},
		{"orders.service.pushlb.", mdns.TypeAAAA, mdns.RcodeSuccess, []string{"fd00::3"}, 0, true},
		{"orders.b.service.pushlb.", mdns.TypeA, mdns.RcodeSuccess, []string{"10.0.0.3"}, 0, true},
		{"orders.nozone.service.pushlb.", mdns.TypeA, mdns.RcodeSuccess, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, 0, true},
		{"orders.service.pushlb.", mdns.TypeTXT, mdns.RcodeSuccess, nil, 0, true},
		{"orders.service.pushlb.", mdns.TypeSRV, mdns.RcodeSuccess, nil, 5, true},
		{"_orders._tcp.service.pushlb.", mdns.TypeSRV, mdns.RcodeSuccess, nil, 5, true},
		{"_orders._tcp.service.pushlb.", mdns.TypeA, mdns.RcodeSuccess, nil, 0, true},
		{"empty.service.pushlb.", mdns.TypeA, mdns.RcodeSuccess, nil, 0, true},
		{"empty.service.pushlb.", mdns.TypeSRV, mdns.RcodeSuccess, nil, 0, true},
		{"nobody.service.pushlb.", mdns.TypeA, mdns.RcodeNameError, nil, 0, true},
		{"_nobody._tcp.service.pushlb.", mdns.TypeSRV, mdns.RcodeNameError, nil, 0, true},
		{"bad!name.service.pushlb.", mdns.TypeA, mdns.RcodeNameError, nil, 0, true},
		{"a.b.orders.service.pushlb.", mdns.TypeA, mdns.RcodeNameError, nil, 0, true},
		{"orders.pushlb.", mdns.TypeA, mdns.RcodeNameError, nil, 0, true},
		{"service.pushlb.", mdns.TypeA, mdns.RcodeSuccess, nil, 0, true},
		{"pushlb.", mdns.TypeSOA, mdns.RcodeSuccess, nil, 1, true},
		{"0a000001.addr.pushlb.", mdns.TypeA, mdns.RcodeSuccess, []string{"10.0.0.1"}, 0, true},
		{"fd000000000000000000000000000003.addr.pushlb.", mdns.TypeAAAA, mdns.RcodeSuccess, []string{"fd00::3"}, 0, true},
		{"0a000001-9001.addr.pushlb.", mdns.TypeA, mdns.RcodeSuccess, []string{"10.0.0.1"}, 0, true},
		{"0a000001-0.addr.pushlb.", mdns.TypeA, mdns.RcodeNameError, nil, 0, true},
		{"0a000001-09.addr.pushlb.", mdns.TypeA, mdns.RcodeNameError, nil, 0, true},
		{"zz.addr.pushlb.", mdns.TypeA, mdns.RcodeNameError, nil, 0, true},
		{"example.com.", mdns.TypeA, mdns.RcodeRefused, nil, 0, false},
		{"orders.service.consul.", mdns.TypeA, mdns.RcodeRefused, nil, 0, false},
	}
	for _, c := range cases {
		for _, network := range []string{"udp", "tcp"} {
			t.Run(fmt.Sprintf("%s/%s/%s", c.name, mdns.TypeToString[c.qtype], network), func(t *testing.T) {
				m := ask(t, s.Addr(), network, c.name, c.qtype)
				if m.Rcode != c.rcode {
					t.Fatalf("rcode %s, want %s", mdns.RcodeToString[m.Rcode], mdns.RcodeToString[c.rcode])
				}
				if m.Authoritative != c.auth {
					t.Errorf("authoritative %v, want %v", m.Authoritative, c.auth)
				}
				if c.want != nil {
					if got := addrs(m); !slices.Equal(got, c.want) {
						t.Errorf("addresses %v, want %v", got, c.want)
					}
				} else if len(m.Answer) != c.answer {
					t.Errorf("%d records, want %d: %v", len(m.Answer), c.answer, m.Answer)
				}
				if len(m.Answer) == 0 && c.rcode != mdns.RcodeRefused {
					if len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != mdns.TypeSOA {
						t.Errorf("a negative answer without the SOA: %v", m.Ns)
					}
				}
				for _, rr := range m.Answer {
					if rr.Header().Ttl != 0 {
						t.Errorf("TTL %d, want the default 0", rr.Header().Ttl)
					}
				}
			})
		}
	}
}

// SRV: ports, weights, zone priorities (the asker's zone label, else the
// responder's zone), host names as targets by name, address targets that
// resolve through the responder with glue in the additional section.
func TestSRV(t *testing.T) {
	s := startServer(t, orders(), dns.Config{Zone: "a"})
	type rec struct {
		prio, weight, port uint16
		target             string
	}
	read := func(m *mdns.Msg) []rec {
		var out []rec
		for _, rr := range m.Answer {
			srv := rr.(*mdns.SRV)
			out = append(out, rec{srv.Priority, srv.Weight, srv.Port, srv.Target})
		}
		slices.SortFunc(out, func(a, b rec) int { return int(a.port) - int(b.port) })
		return out
	}
	zoneA := []rec{
		{1, 300, 9001, "0a000001-9001.addr.pushlb."},
		{1, 100, 9002, "0a000002-9002.addr.pushlb."},
		{2, 50, 9003, "0a000003-9003.addr.pushlb."},
		{2, 100, 9004, "fd000000000000000000000000000003-9004.addr.pushlb."},
		{2, 100, 9005, "orders-7.internal.example."},
	}
	zoneB := slices.Clone(zoneA)
	for i := range zoneB {
		zoneB[i].prio = 3 - zoneB[i].prio
	}
	for _, c := range []struct {
		name string
		want []rec
	}{
		{"_orders._tcp.service.pushlb.", zoneA}, // the responder's zone
		{"orders.service.pushlb.", zoneA},
		{"_orders._tcp.b.service.pushlb.", zoneB}, // the asker's
		{"orders.b.service.pushlb.", zoneB},
	} {
		m := ask(t, s.Addr(), "udp", c.name, mdns.TypeSRV)
		if got := read(m); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		glue := 0
		for _, rr := range m.Extra {
			switch rr.(type) {
			case *mdns.A, *mdns.AAAA:
				glue++
			}
		}
		if glue != 4 {
			t.Errorf("%s: %d address records in the additional section, want 4: %v", c.name, glue, m.Extra)
		}
		// Every address target resolves through the responder.
		for _, r := range c.want[:4] {
			qt := mdns.TypeA
			if len(r.target) > 40 {
				qt = mdns.TypeAAAA
			}
			if a := ask(t, s.Addr(), "udp", r.target, qt); len(a.Answer) != 1 {
				t.Errorf("%s: %v", r.target, a)
			}
		}
	}
	// The responder's zone narrows A to its instances too.
	if got := addrs(ask(t, s.Addr(), "udp", "orders.service.pushlb.", mdns.TypeA)); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
		t.Errorf("A in zone a: %v", got)
	}
}

// Answers rotate: each instance comes first in turn.
func TestRotation(t *testing.T) {
	s := startServer(t, orders(), dns.Config{})
	first := map[string]int{}
	for range 30 {
		m := ask(t, s.Addr(), "udp", "orders.service.pushlb.", mdns.TypeA)
		first[m.Answer[0].(*mdns.A).A.String()]++
	}
	if len(first) != 3 {
		t.Errorf("first records over 30 answers: %v, want each of the 3 instances", first)
	}
}

// A list larger than a UDP answer: TC set and as many records as fit over
// UDP (512 bytes without EDNS, more with it), all of them over TCP;
// MaxAnswers caps both.
func TestTruncation(t *testing.T) {
	list := make([]balancer.Server, 200)
	for i := range list {
		list[i] = balancer.Server{ID: fmt.Sprint(i), Host: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), Port: 8000 + i}
	}
	src := dns.NewStatic(map[string][]balancer.Server{"big": list})
	s := startServer(t, src, dns.Config{TTL: time.Second})
	name := "big.service.pushlb."

	udp := ask(t, s.Addr(), "udp", name, mdns.TypeA)
	if !udp.Truncated || len(udp.Answer) == 0 || len(udp.Answer) >= 200 {
		t.Errorf("UDP: TC %v with %d records, want TC and a part", udp.Truncated, len(udp.Answer))
	}
	udp.Compress = true // as it was sent
	if n, _ := udp.Pack(); len(n) > 512 {
		t.Errorf("UDP answer of %d bytes, want at most 512", len(n))
	}
	edns, err := exchange(s.Addr(), "udp", name, mdns.TypeA, 1232)
	if err != nil {
		t.Fatal(err)
	}
	if !edns.Truncated || len(edns.Answer) <= len(udp.Answer) {
		t.Errorf("EDNS 1232: TC %v with %d records, want TC and more than %d", edns.Truncated, len(edns.Answer), len(udp.Answer))
	}
	tcp := ask(t, s.Addr(), "tcp", name, mdns.TypeA)
	if tcp.Truncated || len(tcp.Answer) != 200 {
		t.Errorf("TCP: TC %v with %d records, want all 200", tcp.Truncated, len(tcp.Answer))
	}
	if ttl := tcp.Answer[0].Header().Ttl; ttl != 1 {
		t.Errorf("TTL %d, want 1", ttl)
	}
	srv := ask(t, s.Addr(), "tcp", "_big._tcp.service.pushlb.", mdns.TypeSRV)
	if len(srv.Answer) != 200 || len(srv.Extra) != 200 {
		t.Errorf("SRV over TCP: %d records, %d additional, want 200 and 200", len(srv.Answer), len(srv.Extra))
	}
	if st := s.Stats(); st.Truncated < 2 {
		t.Errorf("Stats.Truncated %d, want 2 or more", st.Truncated)
	}

	capped := startServer(t, src, dns.Config{MaxAnswers: 3})
	for _, network := range []string{"udp", "tcp"} {
		m := ask(t, capped.Addr(), network, name, mdns.TypeA)
		if m.Truncated || len(m.Answer) != 3 {
			t.Errorf("MaxAnswers 3 over %s: TC %v with %d records, want 3 without TC", network, m.Truncated, len(m.Answer))
		}
	}
}

// Malformed packets are dropped or refused and counted; the responder
// answers on.
func TestMalformed(t *testing.T) {
	s := startServer(t, orders(), dns.Config{})
	conn, err := net.Dial("udp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := new(mdns.Msg)
	q.SetQuestion("orders.service.pushlb.", mdns.TypeA)
	good, _ := q.Pack()
	resp := q.Copy()
	resp.Response = true
	response, _ := resp.Pack()
	two := q.Copy()
	two.Question = append(two.Question, two.Question[0])
	twoQ, _ := two.Pack()
	bad := [][]byte{
		{1, 2, 3},          // shorter than a header
		good[:len(good)-3], // the question cut
		append(slices.Clone(good[:12]), 0xff, 0xff, 0xff, 0xff, 0xff), // a bad name
		response, // a response, not a query
		twoQ,     // two questions
		[]byte(strings.Repeat("x", 600)),
	}
	for _, b := range bad {
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	want := uint64(len(bad))
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Malformed < want && time.Now().Before(deadline) {
		ask(t, s.Addr(), "udp", "orders.service.pushlb.", mdns.TypeA) // a round trip, not a sleep
	}
	if got := s.Stats().Malformed; got != want {
		t.Errorf("Stats.Malformed %d, want %d", got, want)
	}
	if m := ask(t, s.Addr(), "udp", "orders.service.pushlb.", mdns.TypeA); len(m.Answer) != 3 {
		t.Errorf("after the malformed packets: %v", m)
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  dns.Config
		want string
	}{
		{dns.Config{Addr: "nope"}, "Addr"},
		{dns.Config{Domain: "a..b"}, "Domain"},
		{dns.Config{TTL: -time.Second}, "TTL"},
		{dns.Config{TTL: 1500 * time.Millisecond}, "TTL"},
		{dns.Config{TTL: 2 * time.Hour}, "TTL"},
		{dns.Config{Zone: "a.b"}, "Zone"},
		{dns.Config{MaxAnswers: -1}, "MaxAnswers"},
		{dns.Config{MaxConcurrent: -1}, "MaxConcurrent"},
	} {
		_, err := dns.New(orders(), c.cfg)
		if !errors.Is(err, dns.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	if _, err := dns.New(nil, dns.Config{}); !errors.Is(err, dns.ErrInvalidConfig) {
		t.Errorf("nil Source: %v", err)
	}
	s, err := dns.New(orders(), dns.Config{Addr: "127.0.0.1:0", Domain: "Mesh.Example"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); !errors.Is(err, dns.ErrStarted) {
		t.Errorf("second Start: %v", err)
	}
	if m := ask(t, s.Addr(), "udp", "orders.service.mesh.example.", mdns.TypeA); len(m.Answer) != 3 {
		t.Errorf("domain mesh.example.: %v", m)
	}
	if m := ask(t, s.Addr(), "udp", "orders.service.pushlb.", mdns.TypeA); m.Rcode != mdns.RcodeRefused {
		t.Errorf("the default domain when another is set: %v", m)
	}
	s.Close(context.Background())
	s.Close(context.Background())
	if err := s.Start(context.Background()); !errors.Is(err, dns.ErrClosed) {
		t.Errorf("Start after Close: %v", err)
	}
}
