package serverlist

// A decoder of registry values for the shape publishers write, without
// encoding/json's reflection: a gateway's cold start decodes every record
// of the registry (100,000 in a large fleet), and encoding/json was a fifth
// of its CPU there. Anything outside that shape goes to encoding/json,
// which stays the definition of what a value means.

import (
	"math"
	"unicode/utf8"
)

// Field bits of parseInstance, to refuse a field given twice.
const (
	fieldService = 1 << iota
	fieldInstanceID
	fieldHost
	fieldPort
	fieldSecure
	fieldZone
	fieldMetadata
	fieldWeight
	fieldIncarnation
	fieldGossipNode
	fieldGossipAddr
	fieldOwner
	fieldNATSServerID
	fieldNATSClientID
	fieldRegion
)

// parseInstance decodes value, the record stored under the key of
// service/id, when it has the shape publishers write: one JSON object of
// Instance's field names spelled exactly, each at most once, strings
// without escapes or control characters in valid UTF-8, integers without
// fraction or exponent, a metadata object of such strings, no null, and
// the service and instance ID of its key. It returns ok false for
// anything else, which the caller decodes with encoding/json: what
// parseInstance accepts, encoding/json decodes to the same Instance
// (FuzzParseInstance). The service and ID are the arguments, not copies;
// zones, metadata and NATS server IDs are taken from x when it holds them
// (nil: copied).
func parseInstance(value []byte, service, id string, x *interner) (in Instance, ok bool) {
	s := scanner{b: value}
	if !s.delim('{') {
		return Instance{}, false
	}
	var seen uint32
	for first := true; ; first = false {
		if first && s.delim('}') {
			break
		}
		name, ok := s.str()
		if !ok || !s.delim(':') {
			return Instance{}, false
		}
		bit, ok := s.field(string(name), &in, service, id, x)
		if !ok || seen&bit != 0 {
			return Instance{}, false
		}
		seen |= bit
		if s.delim(',') {
			continue
		}
		if !s.delim('}') {
			return Instance{}, false
		}
		break
	}
	s.space()
	const named = fieldService | fieldInstanceID
	if s.i != len(s.b) || seen&named != named {
		return Instance{}, false
	}
	return in, true
}

// field decodes the value of the field name into in and returns its bit.
func (s *scanner) field(name string, in *Instance, service, id string, x *interner) (bit uint32, ok bool) {
	switch name {
	case "service":
		v, ok := s.str()
		in.Service = service
		return fieldService, ok && string(v) == service
	case "instanceId":
		v, ok := s.str()
		in.InstanceID = id
		return fieldInstanceID, ok && string(v) == id
	case "host":
		return fieldHost, s.text(&in.Host, nil)
	case "port":
		return fieldPort, integer(s, &in.Port)
	case "secure":
		in.Secure, ok = s.boolean()
		return fieldSecure, ok
	case "zone":
		return fieldZone, s.text(&in.Zone, x)
	case "region":
		return fieldRegion, s.text(&in.Region, x)
	case "metadata":
		in.Metadata, ok = s.labels(x)
		return fieldMetadata, ok
	case "weight":
		return fieldWeight, integer(s, &in.Weight)
	case "incarnation":
		return fieldIncarnation, integer(s, &in.Incarnation)
	case "gossipNode":
		return fieldGossipNode, s.text(&in.GossipNode, nil)
	case "gossipAddr":
		return fieldGossipAddr, s.text(&in.GossipAddr, nil)
	case "owner":
		return fieldOwner, s.text(&in.Owner, nil)
	case "natsServerId":
		return fieldNATSServerID, s.text(&in.NATSServerID, x)
	case "natsClientId":
		v, ok := s.uint()
		in.NATSClientID = v
		return fieldNATSClientID, ok
	}
	return 0, false
}

// scanner reads the JSON of one value from b, from i on.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// delim consumes c, after any space, if it comes next.
func (s *scanner) delim(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str returns the bytes of a plain string (no escape, no control
// character, valid UTF-8) in b.
func (s *scanner) str() ([]byte, bool) {
	if !s.delim('"') {
		return nil, false
	}
	for j := s.i; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := s.b[s.i:j]
			if !utf8.Valid(v) {
				return nil, false
			}
			s.i = j + 1
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		}
	}
	return nil, false
}

// text decodes a plain string into dst, taken from x when it holds it.
func (s *scanner) text(dst *string, x *interner) bool {
	v, ok := s.str()
	if ok {
		*dst = x.internBytes(v)
	}
	return ok
}

// digits consumes an integer's digits, after an optional '-', and returns
// them. It refuses a leading zero, more than 20 digits, and a number that
// goes on (a fraction, an exponent).
func (s *scanner) digits() (neg bool, v uint64, ok bool) {
	s.space()
	j := s.i
	if j < len(s.b) && s.b[j] == '-' {
		neg = true
		j++
	}
	start := j
	for j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9' {
		d := uint64(s.b[j] - '0')
		if v > (math.MaxUint64-d)/10 {
			return false, 0, false
		}
		v = v*10 + d
		j++
	}
	if n := j - start; n == 0 || (n > 1 && s.b[start] == '0') {
		return false, 0, false
	}
	if j < len(s.b) {
		switch s.b[j] {
		case ',', '}', ' ', '\t', '\n', '\r':
		default:
			return false, 0, false
		}
	}
	s.i = j
	return neg, v, true
}

// integer decodes a signed integer into dst, which must hold it
// (math.MinInt64 falls back to encoding/json).
func integer[T int | int64](s *scanner, dst *T) bool {
	neg, v, ok := s.digits()
	if !ok || v > math.MaxInt64 {
		return false
	}
	n := int64(v)
	if neg {
		n = -n
	}
	if int64(T(n)) != n {
		return false
	}
	*dst = T(n)
	return true
}

// uint decodes a non-negative integer.
func (s *scanner) uint() (uint64, bool) {
	neg, v, ok := s.digits()
	return v, ok && (!neg || v == 0)
}

// boolean decodes true or false.
func (s *scanner) boolean() (v, ok bool) {
	s.space()
	for _, lit := range [...]struct {
		text string
		v    bool
	}{{"true", true}, {"false", false}} {
		end := s.i + len(lit.text)
		if end <= len(s.b) && string(s.b[s.i:end]) == lit.text {
			if end < len(s.b) {
				switch s.b[end] {
				case ',', '}', ' ', '\t', '\n', '\r':
				default:
					return false, false
				}
			}
			s.i = end
			return lit.v, true
		}
	}
	return false, false
}

// labels decodes an object of plain strings (an empty one is an empty
// map, as encoding/json makes it; a key given twice keeps its last value,
// as there).
func (s *scanner) labels(x *interner) (map[string]string, bool) {
	if !s.delim('{') {
		return nil, false
	}
	md := make(map[string]string)
	if s.delim('}') {
		return md, true
	}
	for {
		k, ok := s.str()
		if !ok || !s.delim(':') {
			return nil, false
		}
		v, ok := s.str()
		if !ok {
			return nil, false
		}
		md[x.internBytes(k)] = x.internBytes(v)
		if s.delim(',') {
			continue
		}
		return md, s.delim('}')
	}
}
