package dns

import (
	"context"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"

	mdns "github.com/miekg/dns"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
)

// SRV priorities: the preferred zone's instances, then the others.
const (
	priorityPreferred = 1
	priorityOther     = 2
)

// Sizes of answers: without EDNS(0) a UDP answer holds 512 bytes; with it,
// what the asker offers, at most ednsSize (the DNS flag day's 1,232,
// which no path fragments).
const (
	ednsSize = 1232
	tcpSize  = mdns.MaxMsgSize
)

// query is a name of the domain, parsed.
type query struct {
	kind    nameKind
	service string // kindService, kindSRV
	zone    string // the zone label, if any
	addr    netip.Addr
}

type nameKind int

const (
	kindNone    nameKind = iota // NXDOMAIN
	kindApex                    // the domain itself: SOA
	kindEmpty                   // service.<domain>: exists, holds nothing
	kindService                 // <service>[.<zone>].service.<domain>
	kindSRV                     // _<service>._tcp[.<zone>].service.<domain>
	kindAddr                    // <hex>.addr.<domain>
)

// parse parses name, in lower case and fully qualified, under the domain;
// ok is false outside it.
func (s *Server) parse(name string) (q query, ok bool) {
	if !mdns.IsSubDomain(s.cfg.Domain, name) {
		return q, false
	}
	rest := strings.TrimSuffix(name[:len(name)-len(s.cfg.Domain)], ".")
	if rest == "" {
		return query{kind: kindApex}, true
	}
	labels := strings.Split(rest, ".")
	n := len(labels)
	switch {
	case n == 2 && labels[1] == "addr":
		if a, ok := decodeAddr(labels[0]); ok {
			return query{kind: kindAddr, addr: a}, true
		}
		return q, true
	case labels[n-1] != "service":
		return q, true
	case n == 1:
		return query{kind: kindEmpty}, true
	}
	labels = labels[:n-1]
	if len(labels) >= 2 && labels[1] == "_tcp" && strings.HasPrefix(labels[0], "_") {
		q = query{kind: kindSRV, service: labels[0][1:]}
		labels = labels[2:]
	} else {
		q = query{kind: kindService, service: labels[0]}
		labels = labels[1:]
	}
	switch len(labels) {
	case 0:
	case 1:
		q.zone = labels[0]
	default:
		return query{}, true
	}
	if events.ValidateService(q.service) != nil {
		return query{}, true
	}
	return q, true
}

// answer builds the reply to r; tcp says whether it goes over TCP.
func (s *Server) answer(ctx context.Context, r *mdns.Msg, tcp bool) *mdns.Msg {
	m := new(mdns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	m.RecursionAvailable = false
	size := mdns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = max(min(int(opt.UDPSize()), ednsSize), mdns.MinMsgSize)
		m.SetEdns0(ednsSize, false)
	}
	if tcp {
		size = tcpSize
	}
	if len(r.Question) != 1 {
		return s.rcode(m, mdns.RcodeFormatError)
	}
	question := r.Question[0]
	if question.Qclass != mdns.ClassINET && question.Qclass != mdns.ClassANY {
		return s.rcode(m, mdns.RcodeRefused)
	}
	q, ok := s.parse(mdns.CanonicalName(question.Name))
	if !ok {
		return s.rcode(m, mdns.RcodeRefused)
	}
	qtype := question.Qtype
	switch q.kind {
	case kindNone:
		return s.negative(m, mdns.RcodeNameError)
	case kindApex:
		if qtype == mdns.TypeSOA || qtype == mdns.TypeANY {
			m.Answer = append(m.Answer, s.soa())
			return s.done(m, mdns.RcodeSuccess)
		}
		return s.negative(m, mdns.RcodeSuccess)
	case kindEmpty:
		return s.negative(m, mdns.RcodeSuccess)
	case kindAddr:
		if rr := s.addrRR(question.Name, q.addr, qtype); rr != nil {
			m.Answer = append(m.Answer, rr)
			return s.done(m, mdns.RcodeSuccess)
		}
		return s.negative(m, mdns.RcodeSuccess)
	}

	servers, err := s.src.Servers(ctx, q.service)
	switch {
	case errors.Is(err, ErrUnknownService) || errors.Is(err, pushlb.ErrUnknownService):
		return s.negative(m, mdns.RcodeNameError)
	case err != nil:
		s.stats.sourceErrors.Add(1)
		s.log.Debug().Err(err).Str("service", q.service).Msg("dns: no list to answer with")
		return s.rcode(m, mdns.RcodeServerFailure)
	}
	zone := q.zone
	if zone == "" {
		zone = s.cfg.Zone
	}
	start := int(s.rotation.Add(1))
	switch {
	case qtype == mdns.TypeSRV:
		s.srvRecords(m, question.Name, servers, zone, start)
	case q.kind == kindService && (qtype == mdns.TypeA || qtype == mdns.TypeAAAA || qtype == mdns.TypeANY):
		s.addrRecords(m, question.Name, servers, zone, qtype, start)
	}
	if len(m.Answer) == 0 {
		return s.negative(m, mdns.RcodeSuccess)
	}
	m.Truncate(size)
	if m.Truncated {
		s.stats.truncated.Add(1)
	}
	return s.done(m, mdns.RcodeSuccess)
}

// addrRecords adds the A and AAAA records qtype asks for: the zone's
// servers that are addresses of the family, or all of them when the zone
// has none, rotated from start. The records of one answer are allocated
// together.
func (s *Server) addrRecords(m *mdns.Msg, name string, servers []*balancer.Server, zone string, qtype uint16, start int) {
	family := func(a netip.Addr) bool {
		switch qtype {
		case mdns.TypeA:
			return a.Is4()
		case mdns.TypeAAAA:
			return a.Is6()
		}
		return true // ANY
	}
	all := make([]netip.Addr, 0, 2*len(servers))
	inZone := 0
	for _, sv := range servers {
		a, err := netip.ParseAddr(sv.Host)
		if err != nil {
			continue // a host name: SRV names it, A and AAAA leave it out
		}
		if a = a.Unmap(); !family(a) {
			continue
		}
		all = append(all, a)
		if zone != "" && strings.EqualFold(sv.Zone, zone) {
			all[inZone], all[len(all)-1] = all[len(all)-1], all[inZone] // the zone's first
			inZone++
		}
	}
	picked := all
	if inZone > 0 {
		picked = all[:inZone]
	}
	n := len(picked)
	if s.cfg.MaxAnswers > 0 {
		n = min(n, s.cfg.MaxAnswers)
	}
	if n == 0 {
		return
	}
	var v4 []mdns.A
	var v6 []mdns.AAAA
	bytes := make([]byte, 0, 16*n)
	m.Answer = make([]mdns.RR, 0, n)
	for i := range n {
		a := picked[(start+i)%len(picked)]
		if a.Is4() {
			if v4 == nil {
				v4 = make([]mdns.A, 0, n)
			}
			b := a.As4()
			bytes = append(bytes, b[:]...)
			v4 = append(v4, mdns.A{Hdr: s.hdr(name, mdns.TypeA), A: bytes[len(bytes)-4 : len(bytes) : len(bytes)]})
			m.Answer = append(m.Answer, &v4[len(v4)-1])
		} else {
			if v6 == nil {
				v6 = make([]mdns.AAAA, 0, n)
			}
			b := a.As16()
			bytes = append(bytes, b[:]...)
			v6 = append(v6, mdns.AAAA{Hdr: s.hdr(name, mdns.TypeAAAA), AAAA: bytes[len(bytes)-16 : len(bytes) : len(bytes)]})
			m.Answer = append(m.Answer, &v6[len(v6)-1])
		}
	}
}

// addrRR is the A or AAAA record of a at name, nil when qtype asks for the
// other family.
func (s *Server) addrRR(name string, a netip.Addr, qtype uint16) mdns.RR {
	switch {
	case a.Is4() && (qtype == mdns.TypeA || qtype == mdns.TypeANY):
		return &mdns.A{Hdr: s.hdr(name, mdns.TypeA), A: net.IP(a.AsSlice())}
	case a.Is6() && (qtype == mdns.TypeAAAA || qtype == mdns.TypeANY):
		return &mdns.AAAA{Hdr: s.hdr(name, mdns.TypeAAAA), AAAA: net.IP(a.AsSlice())}
	}
	return nil
}

// srvRecords adds an SRV record per server, rotated from start, with the
// address records of the targets that are addresses in the additional
// section.
func (s *Server) srvRecords(m *mdns.Msg, name string, servers []*balancer.Server, zone string, start int) {
	n := len(servers)
	if s.cfg.MaxAnswers > 0 {
		n = min(n, s.cfg.MaxAnswers)
	}
	for i := range n {
		sv := servers[(start+i)%len(servers)]
		prio := uint16(priorityPreferred)
		if zone != "" && !strings.EqualFold(sv.Zone, zone) {
			prio = priorityOther
		}
		srv := &mdns.SRV{Hdr: s.hdr(name, mdns.TypeSRV), Priority: prio, Weight: uint16(sv.EffectiveWeight()), Port: uint16(sv.Port)}
		if a, err := netip.ParseAddr(sv.Host); err == nil {
			a = a.Unmap()
			// One target per instance, address and port: a client that
			// keys its servers by target (HAProxy's server-template) would
			// take two instances on one address for one.
			srv.Target = encodeAddr(a) + "-" + strconv.Itoa(sv.Port) + ".addr." + s.cfg.Domain
			m.Extra = append(m.Extra, s.addrRR(srv.Target, a, mdns.TypeANY))
		} else {
			srv.Target = mdns.Fqdn(sv.Host)
		}
		m.Answer = append(m.Answer, srv)
	}
}

// encodeAddr is a's label under addr.<domain>: its bytes in hex (8 digits
// for IPv4, 32 for IPv6), as Consul names its SRV targets; an SRV target
// adds "-<port>".
func encodeAddr(a netip.Addr) string {
	b := a.AsSlice()
	return hex.EncodeToString(b)
}

// decodeAddr reads a label of encodeAddr, with or without the port an
// SRV target adds ("7f000001-9001").
func decodeAddr(label string) (netip.Addr, bool) {
	if hexa, port, ok := strings.Cut(label, "-"); ok {
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 || strconv.FormatUint(p, 10) != port {
			return netip.Addr{}, false
		}
		label = hexa
	}
	if len(label) != 8 && len(label) != 32 {
		return netip.Addr{}, false
	}
	b, err := hex.DecodeString(label)
	if err != nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(b)
	return a, ok
}

func (s *Server) hdr(name string, rrtype uint16) mdns.RR_Header {
	return mdns.RR_Header{Name: name, Rrtype: rrtype, Class: mdns.ClassINET, Ttl: s.ttl}
}

// soa is the domain's SOA record: its minimum, the negative answers' TTL,
// is the TTL of the answers.
func (s *Server) soa() *mdns.SOA {
	return &mdns.SOA{
		Hdr: s.hdr(s.cfg.Domain, mdns.TypeSOA),
		Ns:  "ns." + s.cfg.Domain, Mbox: "hostmaster." + s.cfg.Domain,
		Serial: 1, Refresh: 3600, Retry: 600, Expire: 86400, Minttl: s.ttl,
	}
}

// negative is an answer without records: NXDOMAIN, or NOERROR for a name
// that exists without records of the type asked; the SOA in the authority
// section tells resolvers how long they may remember it (RFC 2308).
func (s *Server) negative(m *mdns.Msg, rcode int) *mdns.Msg {
	m.Ns = append(m.Ns, s.soa())
	return s.done(m, rcode)
}

// rcode is an error answer.
func (s *Server) rcode(m *mdns.Msg, rcode int) *mdns.Msg {
	m.Authoritative = rcode != mdns.RcodeRefused
	return s.done(m, rcode)
}

func (s *Server) done(m *mdns.Msg, rcode int) *mdns.Msg {
	m.Rcode = rcode
	s.stats.count(rcode, len(m.Answer) > 0)
	return m
}
