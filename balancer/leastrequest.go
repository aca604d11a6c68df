package balancer

// LeastRequest picks the less loaded of two servers drawn at random (power
// of two choices, as Envoy's and grpc-go's least_request policies do),
// skipping servers whose breaker is open. It is O(1) on every path: a pick
// reads two active counts, and request start and end pay nothing for it.
// It is not exact: with no server busy it is uniform, and it avoids loaded
// servers strongly (a server with the most load of all is only picked when
// drawn twice), but it may pick a server with one request more than the
// least loaded. Prefer it to BestAvailable when several gateways balance
// over the same servers (each sees only its own requests, so exact least
// is not exact anyway, and every gateway sending to the same least-loaded
// server at once herds), or when requests are short and many.
//
// A drawn server whose breaker is open is replaced by another draw, up to
// leastRequestDraws draws; when they all find open breakers, the view is
// scanned round robin for a server whose breaker is closed, and when every
// breaker is open, round robin (as BestAvailable falls back).
//
// When weights differ, servers are drawn in proportion to their weights
// and compared by active requests divided by weight (as Envoy's
// least_request over weighted hosts): idle, the traffic follows the
// weights; loaded, a server of weight 300 takes three times the requests
// in flight of one of weight 100.
type LeastRequest struct{ c *counter }

// NewLeastRequest returns a LeastRequest rule.
func NewLeastRequest() *LeastRequest { return &LeastRequest{c: newCounter()} }

// leastRequestDraws bounds the random draws of one pick.
const leastRequestDraws = 8

// Choose implements Rule.
func (r *LeastRequest) Choose(p PickInfo) (*Server, error) {
	list := p.View.servers
	n := len(list)
	switch n {
	case 0:
		return nil, nil
	case 1:
		return list[0], nil
	}
	if p.View.wt != nil {
		return r.chooseWeighted(&p)
	}
	rnd := p.Rand()
	var first *Server
	var firstActive int64
	for range leastRequestDraws {
		s := list[intN(rnd, n)]
		if mayBeTripped(s) && p.Tripped(s) {
			continue
		}
		a := s.inst.view().active.Load()
		if a > 0 {
			a = p.ActiveRequests(s) // with the decay, which needs the clock
		}
		if first == nil {
			first, firstActive = s, a
			continue
		}
		if a < firstActive {
			return s, nil
		}
		return first, nil
	}
	if first != nil {
		return first, nil
	}
	if s := r.c.roundRobinWhere(list, availability{}, p.nanotime()); s != nil {
		return s, nil
	}
	return r.c.roundRobin(list), nil
}

// chooseWeighted is Choose over a view whose weights differ: weighted
// draws, and a < b compared as a / weight(a) < b / weight(b).
func (r *LeastRequest) chooseWeighted(p *PickInfo) (*Server, error) {
	v := p.View
	rnd := p.Rand()
	var first *Server
	var firstActive int64
	var fi int
	for range leastRequestDraws {
		i := v.wt.random(rnd)
		s := v.servers[i]
		if mayBeTripped(s) && p.Tripped(s) {
			continue
		}
		a := s.inst.view().active.Load()
		if a > 0 {
			a = p.ActiveRequests(s)
		}
		if first == nil {
			first, firstActive, fi = s, a, i
			continue
		}
		// The live weights (slow start: slowstart.go).
		if a*int64(v.wt.weight(fi)) < firstActive*int64(v.wt.weight(i)) {
			return s, nil
		}
		return first, nil
	}
	if first != nil {
		return first, nil
	}
	if s := r.c.roundRobinWhere(v.servers, availability{}, p.nanotime()); s != nil {
		return s, nil
	}
	return r.c.roundRobinView(v), nil
}

var _ Rule = (*LeastRequest)(nil)
