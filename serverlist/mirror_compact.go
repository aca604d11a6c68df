package serverlist

// How the mirror keeps 100,000 records small: the strings that many
// records repeat (zones, metadata keys and values; NATS server IDs in
// mirror_conns.go) are kept once, and an instance's metadata is a sorted
// slice of labels, not a map of its own, shared by the records that carry
// the same. Only the mirror's goroutine (mirror.go) builds entries;
// readers get an Instance with a map of its own, as before.

import (
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/pushlb/pushlb/balancer"
)

// interner returns one copy of each string it is given, so that the
// records that repeat a string share it. It is bounded: strings longer than
// maxInternLen, and new strings once it holds maxInterned, are returned as
// they are (kept per record, as without it). It never forgets a string:
// what it holds is at most maxInterned x maxInternLen bytes (8 MiB), and in
// practice the few zones and labels of a deployment. Not safe for
// concurrent use: only the mirror's goroutine calls it.
type interner struct {
	m map[string]string
}

const (
	maxInterned  = 1 << 16
	maxInternLen = 128
)

func (x *interner) intern(s string) string {
	if s == "" || len(s) > maxInternLen {
		return s
	}
	if c, ok := x.m[s]; ok {
		return c
	}
	if len(x.m) >= maxInterned {
		return s
	}
	if x.m == nil {
		x.m = make(map[string]string)
	}
	s = strings.Clone(s) // its own bytes, not part of a larger buffer
	x.m[s] = s
	return s
}

// internBytes is intern of string(b), which it copies only when it keeps
// a new string or holds none (a nil interner copies).
func (x *interner) internBytes(b []byte) string {
	if x == nil {
		return string(b)
	}
	if c, ok := x.m[string(b)]; ok {
		return c
	}
	return x.intern(string(b))
}

// label is one metadata entry.
type label struct{ key, value string }

// labelSets keeps one copy of each set of labels records repeat: the
// instances of a service mostly carry the same labels (a version, a
// team), and a map per record costs some 300 bytes (a group of eight
// slots and its header) for one label. The set is the map the record's
// server holds (record.srv.Metadata), shared with the balancer that lists
// it, never modified. Like the interner it never forgets a set and is
// bounded: past maxLabelSets sets, or for a set whose key would exceed
// maxLabelSetKey bytes, it returns a map of the record's own. Not safe
// for concurrent use: only the mirror's goroutine calls it.
type labelSets struct {
	m map[string]map[string]string // by key (see of)
	// Scratch space of of, reused from one record to the next.
	sorted []label
	key    []byte
}

const (
	maxLabelSets   = 1 << 14
	maxLabelSetKey = 512
)

// of returns md's labels as a map (nil for none), shared with the records
// that carry the same ones, their keys and values interned.
func (s *labelSets) of(md map[string]string, x *interner) map[string]string {
	if len(md) == 0 {
		return nil
	}
	// The key: each label's key and value, sorted, length-prefixed (any
	// byte may occur in them).
	s.sorted = s.sorted[:0]
	for k, v := range md {
		s.sorted = append(s.sorted, label{k, v})
	}
	slices.SortFunc(s.sorted, func(a, b label) int { return strings.Compare(a.key, b.key) })
	s.key = s.key[:0]
	for _, kv := range s.sorted {
		s.key = binary.AppendUvarint(s.key, uint64(len(kv.key)))
		s.key = append(s.key, kv.key...)
		s.key = binary.AppendUvarint(s.key, uint64(len(kv.value)))
		s.key = append(s.key, kv.value...)
	}
	clear(s.sorted) // holds none of md's strings past this call
	if l, ok := s.m[string(s.key)]; ok {
		return l
	}
	l := make(map[string]string, len(md))
	for k, v := range md {
		l[x.intern(k)] = x.intern(v)
	}
	if len(s.m) < maxLabelSets && len(s.key) <= maxLabelSetKey {
		if s.m == nil {
			s.m = make(map[string]map[string]string)
		}
		s.m[string(s.key)] = l
	}
	return l
}

// record is an instance as the mirror keeps it: the fields a balancer
// routes by as the balancer's own server (srv), which lbvisitor hands to
// the balancer that lists the instance instead of a copy
// (balancer.SetServersShared: one copy of each instance, not two), and the
// fields that many records leave empty in an extension of their own
// (recordExt). Without its service (the service's map holds it:
// mirrorService.name), with its revision and sum, an entry takes 32
// bytes and its server 144: 176 where a compact record of its own (96)
// and the balancer's copy (144) took 240.
type record struct {
	// srv is the instance's ID, address, scheme, zone, region, metadata
	// (shared with the records that carry the same: labelSets), weight
	// and incarnation. The mirror never modifies it once stored: a
	// change makes another (compact), which keeps the one before when
	// its fields are the same. A balancer fills in its unexported fields
	// when it lists it; the mirror reads its exported fields only.
	srv *balancer.Server
	ext *recordExt // nil when all its fields are empty; never modified
}

// regional reports whether the record is a copy of another region's
// (IsRegionalKey): never in the connection index, leased or reaped here.
func (r *record) regional() bool { return r.ext != nil && r.ext.regional }

// gossipDefault reports whether the instance's gossip node has the name
// gossip gives it by default, which the record derives instead of keeping
// it (extStrings.gossipNode is then empty): see defaultGossipNode.
func (r *record) gossipDefault() bool { return r.ext != nil && r.ext.gossipDefault }

// ServerOf returns the balancer server of an instance: its ID, address,
// scheme (https when Secure), zone, region, metadata, weight and
// incarnation.
func ServerOf(in Instance) balancer.Server {
	scheme := "http"
	if in.Secure {
		scheme = "https"
	}
	return balancer.Server{
		ID: in.InstanceID, Host: in.Host, Port: in.Port, Scheme: scheme,
		Zone: in.Zone, Region: in.Region, Metadata: in.Metadata, Weight: in.Weight, Incarnation: in.Incarnation,
	}
}

// sameServer reports whether s has the exported fields of c, whose
// metadata is md.
func sameServer(s, c *balancer.Server, md map[string]string) bool {
	return s.ID == c.ID && s.Host == c.Host && s.Port == c.Port && s.Scheme == c.Scheme &&
		s.Zone == c.Zone && s.Region == c.Region && s.Weight == c.Weight && s.Incarnation == c.Incarnation &&
		s.Value == nil && maps.Equal(s.Metadata, md)
}

// recordExt holds the fields of a record that a bare instance (a service,
// an ID, an address, a zone) leaves empty: its owner, gossip member and
// NATS connection, which announce and a publisher's gossip fill in. Kept
// in the record they took 72 bytes of every entry, which then needed 160;
// a pointer (nil for none) takes 8, so a bare entry takes 96, and one
// that carries them 96 and this extension's 48 (64 with the owner and
// gossip address as strings, and their own allocations beside).
//
// The owner a publisher writes (hex of 12 random bytes, 24 characters:
// publisher.newOwner; the scale fleet writes 32) is unique to its process,
// so the interner cannot share it: kept as a string, it took an allocation
// of its own (24 or 32 bytes) besides its 16-byte header, 3.2 MB of
// 100,000 announce records. Lowercase hex of at most 32 characters is kept
// as the bytes it encodes (owner, ownerLen: 17 bytes in place of the
// header) and encoded again when read (ownerString: the same string); any
// other owner (upper case, an odd length or more than 32 characters), and
// a gossip node that does not have the default name, are kept as strings
// in extStrings (48 bytes, allocated only for them), which the records of
// announce and a publisher do not need.
//
// The gossip address ("host:port" of the instance's gossip node, which
// announce advertises on the address it reaches its peers from) is
// unique to its record too, and mostly the record's host with another
// port: kept as a string, it took 16 to 24 bytes besides its header
// (some 2 MB of 100,000 announce records). An address that is
// the record's host and a port, as net.JoinHostPort writes them (IPv6 in
// brackets), is kept as its port (gossipPort) and written again when read
// (gossipAddrOf); any other stays a string in extStrings.
type recordExt struct {
	owner      [16]byte    // the owner's bytes, when ownerLen is not 0 (packOwner)
	more       *extStrings // nil when its fields are empty; never modified
	natsServer *string     // nil for none; interned (connIndex.intern)
	natsClient uint64
	gossipPort uint16 // 0: the gossip address is more.gossipAddr
	ownerLen   uint8  // 0: the owner is more.owner
	// The record's flags (record.gossipDefault, record.regional), in the
	// extension's padding rather than in every entry's: a record from
	// announce with gossip on has an extension anyway (its owner, its
	// connection), and another region's copy costs one more (48 bytes)
	// where every entry saves 16.
	gossipDefault, regional bool
}

// extStrings holds the fields of a record's extension that it keeps as
// strings, those that do not take a smaller form (recordExt).
type extStrings struct {
	owner, gossipNode, gossipAddr string
}

// extra returns the record's extension, its zero value for none.
func (r *record) extra() recordExt {
	if r.ext == nil {
		return recordExt{}
	}
	return *r.ext
}

// strs returns the extension's strings, their zero value for none.
func (x *recordExt) strs() extStrings {
	if x.more == nil {
		return extStrings{}
	}
	return *x.more
}

// ownerString returns the record's owner.
func (x *recordExt) ownerString() string {
	if x.ownerLen == 0 {
		return x.strs().owner
	}
	var b [32]byte
	hex.Encode(b[:], x.owner[:x.ownerLen])
	return string(b[:2*x.ownerLen])
}

// gossipAddress returns the record's gossip address; host is the
// record's.
func (x *recordExt) gossipAddress(host string) string {
	if x.gossipPort == 0 {
		return x.strs().gossipAddr
	}
	return gossipAddrOf(host, x.gossipPort)
}

// gossipAddrOf is net.JoinHostPort(host, port) in one allocation.
func gossipAddrOf(host string, port uint16) string {
	var b [5]byte
	p := strconv.AppendUint(b[:0], uint64(port), 10)
	if strings.IndexByte(host, ':') >= 0 {
		return "[" + host + "]:" + string(p)
	}
	return host + ":" + string(p)
}

// gossipPortOf returns port when addr is gossipAddrOf(host, port), a port
// of 1 to 65535 in decimal without a leading zero, and 0 for any other
// address (another host, the host's other spellings, port 0, none), which
// the record keeps as a string.
func gossipPortOf(addr, host string) uint16 {
	rest, ok := addr, true
	if strings.IndexByte(host, ':') >= 0 {
		if rest, ok = strings.CutPrefix(rest, "["); ok {
			if rest, ok = strings.CutPrefix(rest, host); ok {
				rest, ok = strings.CutPrefix(rest, "]:")
			}
		}
	} else if rest, ok = strings.CutPrefix(rest, host); ok {
		rest, ok = strings.CutPrefix(rest, ":")
	}
	if !ok || rest == "" || len(rest) > 5 || rest[0] == '0' {
		return 0
	}
	port := 0
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if c < '0' || c > '9' {
			return 0
		}
		port = port*10 + int(c-'0')
	}
	if port > 65535 {
		return 0
	}
	return uint16(port)
}

// packOwner returns the bytes owner encodes and their number when owner
// is lowercase hex of 2 to 32 characters, an even number, which
// hex.Encode gives back exactly; n is 0 for any other owner (upper case,
// another length, empty), which the record keeps as a string.
func packOwner(owner string) (b [16]byte, n uint8) {
	if owner == "" || len(owner)%2 != 0 || len(owner) > 2*len(b) {
		return b, 0
	}
	for i := 0; i < len(owner); i += 2 {
		hi, lo := hexDigit(owner[i]), hexDigit(owner[i+1])
		if hi < 0 || lo < 0 {
			return [16]byte{}, 0
		}
		b[i/2] = byte(hi<<4 | lo)
	}
	return b, uint8(len(owner) / 2)
}

// hexDigit returns the value of a lowercase hex digit, -1 for any other
// byte.
func hexDigit(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}

// defaultGossipNode is the gossip node name of an instance that names
// none (gossip.DefaultNodeName: "<service>/<id>/<incarnation>", as
// announce's and a publisher's gossip members are named): some 40 bytes
// that a record derives instead of keeping.
func defaultGossipNode(service, id string, incarnation int64) string {
	return service + "/" + id + "/" + strconv.FormatInt(incarnation, 10)
}

// isDefaultGossipNode reports whether node is defaultGossipNode(service,
// id, incarnation), without building it.
func isDefaultGossipNode(node, service, id string, incarnation int64) bool {
	rest, ok := cutPart(node, service)
	if !ok {
		return false
	}
	if rest, ok = cutPart(rest, id); !ok {
		return false
	}
	var b [20]byte
	return rest == string(strconv.AppendInt(b[:0], incarnation, 10))
}

// cutPart returns s without its leading part and the '/' after it.
func cutPart(s, part string) (string, bool) {
	if len(s) <= len(part) || s[len(part)] != '/' || s[:len(part)] != part {
		return "", false
	}
	return s[len(part)+1:], true
}

// compact returns the entry of a decoded, valid instance of id (regional:
// another region's copy): its strings
// shared with the records that repeat them, its metadata as labels.
func (m *Mirror) compact(in Instance, id string, sum valueSum, rev uint64, regional bool, prev *mirrorEntry) *mirrorEntry {
	e := &mirrorEntry{sum: sum}
	c := ServerOf(in)
	c.ID, c.Zone, c.Region, c.Metadata = id, m.shared.intern(in.Zone), m.shared.intern(in.Region), nil
	if prev != nil && sameServer(prev.rec.srv, &c, in.Metadata) {
		// Only the extension changed (a new connection, owner or
		// gossip member): the balancer keeps its server.
		e.rec.srv = prev.rec.srv
	} else {
		c.Metadata = m.labelSets.of(in.Metadata, &m.shared)
		e.rec.srv = new(balancer.Server)
		*e.rec.srv = c
	}
	ext := recordExt{natsServer: m.conns.intern(in.NATSServerID), natsClient: in.NATSClientID, regional: regional}
	if regional {
		// Another region's connection: its advisories are not this
		// region's (a copy is written without it; this keeps it so).
		ext.natsServer, ext.natsClient = nil, 0
	}
	var more extStrings
	if ext.owner, ext.ownerLen = packOwner(in.Owner); ext.ownerLen == 0 {
		more.owner = in.Owner
	}
	if ext.gossipPort = gossipPortOf(in.GossipAddr, in.Host); ext.gossipPort == 0 {
		more.gossipAddr = in.GossipAddr
	}
	if isDefaultGossipNode(in.GossipNode, in.Service, id, in.Incarnation) {
		ext.gossipDefault = true
	} else {
		more.gossipNode = in.GossipNode
	}
	if more != (extStrings{}) {
		ext.more = new(extStrings) // a copy, as for ext below
		*ext.more = more
	}
	if ext != (recordExt{}) {
		// A copy: taking ext's address would move it to the heap for
		// every record, bare ones included.
		e.rec.ext = new(recordExt)
		*e.rec.ext = ext
	}
	e.rev.Store(rev)
	return e
}

// base returns the entry's instance of service without its metadata.
func (e *mirrorEntry) base(service string) Instance {
	r, s := &e.rec, e.rec.srv
	x := r.extra()
	in := Instance{
		Service: service, InstanceID: s.ID, Host: s.Host, Port: s.Port, Secure: s.Scheme == "https",
		Zone: s.Zone, Region: s.Region, Weight: s.Weight, Incarnation: s.Incarnation,
		GossipNode: x.strs().gossipNode, GossipAddr: x.gossipAddress(s.Host), Owner: x.ownerString(),
		NATSServerID: x.serverID(), NATSClientID: x.natsClient,
	}
	if x.gossipDefault {
		in.GossipNode = defaultGossipNode(service, s.ID, s.Incarnation)
	}
	return in
}

// instance returns the entry's instance of service, with a metadata map of
// its own.
func (e *mirrorEntry) instance(service string) Instance {
	in := e.base(service)
	in.Metadata = maps.Clone(e.rec.srv.Metadata)
	return in
}

// serverID is the record's NATS server ID, empty for none.
func (x *recordExt) serverID() string {
	if x.natsServer == nil {
		return ""
	}
	return *x.natsServer
}

// holds reports whether the entry holds in, a decoded instance of its
// service ([Instance.Equal]).
func (e *mirrorEntry) holds(in Instance) bool {
	md := in.Metadata
	in.Metadata = nil
	return e.base(in.Service).Equal(in) && maps.Equal(e.rec.srv.Metadata, md)
}

// sameInstance reports whether two entries of one service hold the same
// instance.
//
// It compares the records' stored forms, which compact makes the same for
// the same instance (interned strings aside, compared by value; an owner
// and a gossip address packed or not by their value alone), rather than
// building each side's Instance: a resync compares every entry, and
// building one allocates its owner, gossip address and default node name.
// Of one service, a default gossip name is the same one on both sides
// when their flags, IDs and incarnations are.
func sameInstance(a, b *mirrorEntry) bool {
	x, y := a.rec.extra(), b.rec.extra()
	return (a.rec.srv == b.rec.srv || sameServer(a.rec.srv, b.rec.srv, b.rec.srv.Metadata)) &&
		x.gossipDefault == y.gossipDefault &&
		x.owner == y.owner && x.ownerLen == y.ownerLen && x.gossipPort == y.gossipPort &&
		x.natsClient == y.natsClient && x.serverID() == y.serverID() && x.strs() == y.strs()
}
