package balancer

import (
	"fmt"
	"maps"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"unique"
)

// Server is one instance of a service.
//
// Callers build Server values and hand them to [Balancer.SetServers]; the
// balancer keeps its own copies, which are what Choose returns. A returned
// *Server is shared and must not be modified. Its [Server.Stats] and
// [Server.Alive] are live views of the instance's state in its balancer.
type Server struct {
	// ID identifies the instance. IDs are opaque strings and may contain
	// ':', '.', '/' or spaces (Eureka's are "host:service:port"). When empty,
	// SetServers uses "host:port".
	ID string
	// Host is a host name or IP address.
	Host string
	// Port is the TCP port, 1 to 65535.
	Port int
	// Scheme is "http" or "https"; empty means "http".
	Scheme string
	// Zone is the instance's zone (availability zone, rack, data centre).
	// Zones are compared without regard to case, as Ribbon does. Empty means
	// the default zone.
	Zone string
	// Region is the instance's region, compared without regard to case.
	// Empty means the balancer's own (Config.Region). A balancer with a
	// Region picks from the nearest region that has a reachable server
	// (locality.go, the package doc's "Regions"); without one, regions are
	// ignored.
	Region string
	// Metadata holds free-form key/value pairs from the registry.
	Metadata map[string]string
	// Weight is the instance's share of traffic relative to the other
	// servers, 1 to MaxWeight; 0 means DefaultWeight (100). Weighted rules
	// send a server traffic in proportion to it (see the package doc,
	// "Weights").
	Weight int
	// Incarnation tells one life of the instance from the next (the
	// registry record's incarnation, which grows with every start); 0
	// when unknown. A server listed again with another incarnation is a
	// restarted instance: its slow start begins again (Config.SlowStart).
	Incarnation int64
	// Value is the caller's own data for this server: the balancer keeps
	// it on its copy, compares it with == when the list changes (a new
	// Value is a changed server, whose statistics stay), and never reads
	// it otherwise. An adapter keeps there what it needs once a pick
	// returns the server (the gRPC balancer: the server's connection),
	// where a map lookup would cost as much as the pick. It must be
	// comparable (a pointer, typically); nil by default.
	Value any

	inst *instance // set on the balancer's copies
	zone zoneName  // lower-case Zone, set on the balancer's copies
}

// zoneName is a zone name in lower case, interned: a server holds one
// pointer (8 bytes less than a string), and the servers of a zone share
// one string.
// The zero value is the empty name.
type zoneName struct{ h unique.Handle[string] }

// zoneNameOf returns zone's name in lower case.
func zoneNameOf(zone string) zoneName {
	if zone == "" {
		return zoneName{}
	}
	return zoneName{unique.Make(lowerASCII(zone))}
}

// String returns the name.
func (z zoneName) String() string {
	if z.h == (unique.Handle[string]{}) {
		return ""
	}
	return z.h.Value()
}

// Server weights (Server.Weight), as the registry's: relative shares.
const (
	DefaultWeight = 100
	MaxWeight     = 1000
)

// EffectiveWeight returns Weight, or DefaultWeight when it is 0.
func (s *Server) EffectiveWeight() int {
	if s.Weight == 0 {
		return DefaultWeight
	}
	return s.Weight
}

// instance is the state of one server ID inside a balancer that outlives
// snapshot swaps: whether it is alive, and its statistics once it has had
// a request. A server that has had none (most of a fleet of 100,000 that
// a gateway follows but rarely routes to; every server of an xDS server's
// or a dashboard's balancers) points at the balancer's zero statistics
// (statsShared.none, which nothing writes and which leads to the
// balancer's shared state), so that its instance is a 16-byte allocation
// instead of 80, and no pointer to the shared state of its own.
type instance struct {
	stats atomic.Pointer[ServerStats] // the balancer's none until own
	alive atomic.Bool
}

func newInstance(shared *statsShared) *instance {
	in := &instance{}
	in.stats.Store(&shared.none)
	in.alive.Store(true)
	return in
}

// view returns the statistics to read: the instance's own, or the
// balancer's zero statistics when it has none yet. Anything that records
// into the statistics takes them from own.
func (in *instance) view() *ServerStats { return in.stats.Load() }

// hasOwn reports whether the instance's statistics are its own.
func (in *instance) hasOwn() bool {
	st := in.stats.Load()
	return st != &st.shared.none
}

// own returns the instance's statistics, allocating them on first use;
// concurrent first uses agree on one.
func (in *instance) own() *ServerStats {
	st := in.stats.Load()
	if none := &st.shared.none; st != none {
		return st
	}
	mine := &ServerStats{shared: st.shared}
	if in.stats.CompareAndSwap(st, mine) {
		return mine
	}
	return in.stats.Load()
}

// Addr returns "host:port", or "[host]:port" for an IPv6 address, as
// net.JoinHostPort does. It builds the string on each call (one
// allocation): a balancer's copy does not keep it, which makes a Server a
// 144-byte allocation instead of 160 and saves the string's bytes, 3.4 MB
// at 100,000 servers (docs/perf/memory.md).
func (s *Server) Addr() string {
	var b strings.Builder
	b.Grow(len(s.Host) + 8) // brackets, ':' and five digits
	if strings.IndexByte(s.Host, ':') >= 0 {
		b.WriteByte('[')
		b.WriteString(s.Host)
		b.WriteByte(']')
	} else {
		b.WriteString(s.Host)
	}
	b.WriteByte(':')
	var port [20]byte
	b.Write(strconv.AppendInt(port[:0], int64(s.Port), 10))
	return b.String()
}

// URLScheme returns the scheme to use in URLs: Scheme, or "http" when empty.
func (s *Server) URLScheme() string {
	if s.Scheme == "" {
		return "http"
	}
	return s.Scheme
}

// String returns the ID and the address, for logs.
func (s *Server) String() string {
	if s.ID == s.Addr() {
		return s.ID
	}
	return s.ID + "@" + s.Addr()
}

// Stats returns the live statistics of the instance, or nil for a Server that
// does not come from a balancer. A balancer allocates a server's
// statistics at its first request; Stats allocates them for one that has
// had none (80 bytes), so that the pointer it returns stays live. To read
// the statistics of many servers (a dashboard, a count), use PeekStats.
func (s *Server) Stats() *ServerStats {
	if s.inst == nil {
		return nil
	}
	return s.inst.own()
}

// PeekStats returns the instance's statistics to read now, without
// allocating: its own once it has had a request (or a Stats call), else
// zero statistics shared by its balancer's servers that have had none,
// which never change. Read it at once; keep Stats instead. Nil for a
// Server that does not come from a balancer.
func (s *Server) PeekStats() *ServerStats {
	if s.inst == nil {
		return nil
	}
	return s.inst.view()
}

// Alive reports whether the instance is alive and ready to serve: not marked
// down and not failing its ping. A server that does not come from a balancer
// is reported alive. pushlb does not keep a separate ready-to-serve flag: an
// instance is announced only once it accepts connections, so a listed
// instance is ready unless it is marked down.
func (s *Server) Alive() bool { return s.inst == nil || s.inst.alive.Load() }

// zoneKey is the zone name used for grouping: lower case, as Ribbon does.
func (s *Server) zoneKey() string { return s.zone.String() }

// normalize checks the fields a balancer needs and fills the ID default.
func (s *Server) normalize() error {
	if s.Host == "" {
		return fmt.Errorf("balancer: server %q: empty host", s.ID)
	}
	if s.Port < 1 || s.Port > 65535 {
		return fmt.Errorf("balancer: server %q: port %d out of range 1-65535", s.ID, s.Port)
	}
	if s.Weight < 0 || s.Weight > MaxWeight {
		return fmt.Errorf("balancer: server %q: weight %d out of range 1-%d (0: %d)", s.ID, s.Weight, MaxWeight, DefaultWeight)
	}
	switch s.Scheme {
	case "", "http", "https":
	default:
		return fmt.Errorf("balancer: server %q: unsupported scheme %q", s.ID, s.Scheme)
	}
	if s.Value != nil && !reflect.TypeOf(s.Value).Comparable() {
		return fmt.Errorf("balancer: server %q: Value of type %T is not comparable", s.ID, s.Value)
	}
	if s.ID == "" {
		s.ID = s.Addr()
	}
	return nil
}

// sameAs reports whether two servers describe the same instance identically.
func (s *Server) sameAs(o *Server) bool {
	return s.ID == o.ID && s.Host == o.Host && s.Port == o.Port &&
		s.URLScheme() == o.URLScheme() && s.Zone == o.Zone && s.Region == o.Region &&
		s.EffectiveWeight() == o.EffectiveWeight() && maps.Equal(s.Metadata, o.Metadata) &&
		s.Value == o.Value && s.Incarnation == o.Incarnation
}

// ParseServer parses "host:port", "http://host:port" or "https://host:port"
// into a Server, as Ribbon's listOfServers entries are written. The ID is the
// "host:port" address.
func ParseServer(s string) (Server, error) {
	raw := strings.TrimSpace(s)
	scheme := ""
	if i := strings.Index(raw, "://"); i >= 0 {
		scheme, raw = raw[:i], raw[i+3:]
	}
	raw = strings.TrimSuffix(raw, "/")
	host, portStr, err := net.SplitHostPort(raw)
	if err != nil {
		return Server{}, fmt.Errorf("balancer: server %q: %w", s, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return Server{}, fmt.Errorf("balancer: server %q: bad port %q", s, portStr)
	}
	srv := Server{Host: host, Port: port, Scheme: scheme}
	if err := srv.normalize(); err != nil {
		return Server{}, err
	}
	return srv, nil
}
