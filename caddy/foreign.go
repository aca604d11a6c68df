package pushlbcaddy

import (
	"net"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/pushlb/pushlb/balancer"
)

// foreignPool is the balancer the policy keeps for a pool that does not
// come from the pushlb source.
type foreignPool struct {
	first *reverseproxy.Upstream // identity of the pool: its first element and length
	n     int
	dials []string
	b     *balancer.Balancer
	byID  map[string]int
}

// foreignFor returns the balancer of pool, building or updating it when
// the pool changed; nil when the pool's addresses are not host:port
// (Unix sockets, placeholders).
func (s *Selection) foreignFor(pool []*reverseproxy.Upstream) *foreignPool {
	if f := s.foreign.Load(); f != nil && f.n == len(pool) && f.first == pool[0] {
		return f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.foreign.Load()
	if old != nil && old.n == len(pool) && old.first == pool[0] {
		return old
	}
	// Another pool value: the same addresses (a source that allocates its
	// upstreams per request) keep the balancer and its statistics.
	if old != nil && old.b != nil && sameDials(old.dials, pool) {
		f := &foreignPool{first: pool[0], n: len(pool), dials: old.dials, b: old.b, byID: old.byID}
		s.foreign.Store(f)
		return f
	}
	servers := make([]balancer.Server, 0, len(pool))
	dials := make([]string, len(pool))
	byID := make(map[string]int, len(pool))
	for i, u := range pool {
		dials[i] = u.Dial
		host, port, err := net.SplitHostPort(u.Dial)
		if err != nil {
			return nil
		}
		pn, err := strconv.Atoi(port)
		if err != nil || pn < 1 || pn > 65535 {
			return nil
		}
		if _, dup := byID[u.Dial]; dup {
			continue
		}
		byID[u.Dial] = i
		servers = append(servers, balancer.Server{ID: u.Dial, Host: host, Port: pn})
	}
	b := old.balancerOrNil()
	if b == nil {
		var err error
		if b, err = balancer.New("caddy", s.cfg); err != nil {
			return nil
		}
	}
	if err := b.SetServers(servers); err != nil && len(b.AllServers()) == 0 {
		return nil
	}
	f := &foreignPool{first: pool[0], n: len(pool), dials: dials, b: b, byID: byID}
	s.foreign.Store(f)
	return f
}

func (f *foreignPool) balancerOrNil() *balancer.Balancer {
	if f == nil {
		return nil
	}
	return f.b
}

func sameDials(dials []string, pool []*reverseproxy.Upstream) bool {
	if len(dials) != len(pool) {
		return false
	}
	for i, u := range pool {
		if dials[i] != u.Dial {
			return false
		}
	}
	return true
}
