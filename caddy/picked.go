package pushlbcaddy

import (
	"context"
	"math/rand/v2"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/pushlb/pushlb/balancer"
)

// picked is what the pushlb source hands Caddy under the pushlb policy
// for one attempt: first the instance the service's balancer picked
// (already started in pushlb's statistics), then up to maxPicks-1 others
// from the list, for Caddy's health to fall back on when it holds the
// pick unavailable. One allocation.
type picked struct {
	ups  [maxPicks]reverseproxy.Upstream
	pool [maxPicks]*reverseproxy.Upstream
	pick balancer.Pick // of ups[0]
	n    int
}

// pickedVar is the request variable through which GetUpstreams hands its
// picks to the policy.
const pickedVar = "pushlb.picked"

// candidates picks the instance of s for r's next attempt with the
// balancer (one pick: the rule's state moves once per attempt) and
// returns it, followed by the next instances of the list, as upstreams.
// The instance of the attempt Caddy is retrying is avoided: when the
// source's zone offers no other, the pick leaves the zone, and the
// instance is used again only when there is no other.
func (s *poolSnapshot) candidates(r *http.Request, sel *Selection) []*reverseproxy.Upstream {
	a, _ := caddyhttp.GetVar(r.Context(), attemptVar).(*attempt)
	a.finish() // Caddy retries: the previous attempt's outcome first
	avoid := a.lastDial()
	hint := sel.hint(r)
	// The instances the pick chooses among: those of the hint while one is
	// alive, as the balancer decides; the list's others stand in only for
	// a request without a hint, or whose hint no instance carries.
	dials := s.dials
	if hinted := s.byHint[hint]; len(hinted) > 0 {
		dials = hinted
	}
	pickIn := func(ctx context.Context) (balancer.Pick, bool) {
		p, err := s.balancer.Pick(sel.pickContext(ctx, r, hint))
		if err != nil {
			return p, false
		}
		if p.Server.Addr() == avoid && len(dials) > 1 {
			p.End() // never sent
			return p, false
		}
		return p, true
	}
	p, ok := pickIn(s.source.zoneCtx)
	if !ok && avoid != "" && s.source.Zone != "" {
		p, ok = pickIn(context.Background())
	}
	pk := &picked{}
	first := 0
	if ok {
		pk.pick = p
		pk.add(p.Server.Addr())
		first = s.byID[p.Server.ID] + 1
	}
	if len(dials) != len(s.dials) {
		first = rand.IntN(len(dials)) // the hint's instances: no index of their own
	}
	for i := range len(dials) {
		if pk.n == maxPicks {
			break
		}
		if d := dials[(first+i)%len(dials)]; d != avoid && !pk.has(d) {
			pk.add(d)
		}
	}
	if pk.n == 0 && avoid != "" {
		pk.add(avoid) // the only instance
	}
	if pk.n == 0 {
		return nil
	}
	caddyhttp.SetVar(r.Context(), pickedVar, pk)
	return pk.pool[:pk.n]
}

func (pk *picked) add(addr string) {
	pk.ups[pk.n].Dial = addr
	pk.pool[pk.n] = &pk.ups[pk.n]
	pk.n++
}

func (pk *picked) has(addr string) bool {
	for i := range pk.n {
		if pk.ups[i].Dial == addr {
			return true
		}
	}
	return false
}

// is reports whether pool is pk's.
func (pk *picked) is(pool []*reverseproxy.Upstream) bool {
	return len(pool) == pk.n && pool[0] == pk.pool[0]
}

// choose returns the first upstream of pk Caddy holds available: the
// pick, or else one of the others (outside pushlb's statistics).
func (pk *picked) choose(r *http.Request, a *attempt) *reverseproxy.Upstream {
	p := pk.pick
	pk.pick = balancer.Pick{} // a second Select of this pool starts nothing
	for i := range pk.n {
		if !pk.pool[i].Available() {
			continue
		}
		if i > 0 || p.Server == nil || p.Server.Addr() != pk.ups[0].Dial {
			p.End() // the pick was not sent
			p = balancer.Pick{}
		}
		track(r, a, p, pk.pool[i])
		return pk.pool[i]
	}
	p.End()
	return nil
}

// is reports whether pool is a copy of s (as copyUpstreams makes).
func (s *poolSnapshot) is(pool []*reverseproxy.Upstream) bool {
	return len(pool) == len(s.dials) && pool[0].Dial == s.dials[0] && pool[len(pool)-1].Dial == s.dials[len(pool)-1]
}
