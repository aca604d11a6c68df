package pushlbcaddy

import (
	"context"
	"math/rand/v2"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/pushlb/pushlb/balancer"
)

// maxPicks bounds the instances pushlb picks for one attempt: the first
// one Caddy holds available is used. It also bounds the picks of one
// Select that Caddy's health refuses, before the policy falls back to any
// available upstream.
const maxPicks = 3

// Select chooses an upstream of pool for r.
func (s *Selection) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	if len(pool) == 0 {
		return nil
	}
	ctx := r.Context()
	a, _ := caddyhttp.GetVar(ctx, attemptVar).(*attempt)
	if pk, ok := caddyhttp.GetVar(ctx, pickedVar).(*picked); ok && pk.is(pool) {
		return pk.choose(r, a)
	}
	var (
		b    picker
		pctx context.Context
		byID map[string]int
	)
	if snap, ok := caddyhttp.GetVar(ctx, poolVar).(*poolSnapshot); ok && snap.hasBalancer && snap.is(pool) {
		// The pushlb source's whole list: pick from it, and have the
		// source hand over picked instances from now on.
		snap.source.pickedBy.CompareAndSwap(nil, s)
		b, pctx, byID = snap.balancer, snap.source.zoneCtx, snap.byID
	} else {
		f := s.foreignFor(pool)
		if f == nil {
			return anyAvailable(pool, a.lastDial())
		}
		b, pctx, byID = f.b, context.Background(), f.byID
	}
	pctx = s.pickContext(pctx, r, s.hint(r))
	previous := a.lastDial()
	for range maxPicks {
		p, err := b.Pick(pctx)
		if err != nil {
			break
		}
		i, ok := byID[p.Server.ID]
		// The index is checked against the address: the list may have
		// changed between the pool's making and the pick.
		if !ok || i >= len(pool) || pool[i].Dial != p.Server.Addr() || !pool[i].Available() || (pool[i].Dial == previous && len(pool) > 1) {
			p.End() // never sent
			continue
		}
		track(r, a, p, pool[i])
		return pool[i]
	}
	// Caddy's health refuses what the rule offers, or the list moved
	// under the pick: any available upstream, as Caddy's random would.
	u := anyAvailable(pool, previous)
	if u != nil {
		track(r, a, balancer.Pick{}, u)
	}
	return u
}

// picker is the balancer a Select picks with: the service's view
// (pushlb.Balancer, one pointer: no allocation as an interface) or the
// policy's own balancer.
type picker interface {
	Pick(context.Context) (balancer.Pick, error)
}

// anyAvailable returns an available upstream of pool not dialled at
// avoid when there is one (one dialled at avoid otherwise), by reservoir
// sampling as Caddy's random policy does; nil when none is available.
func anyAvailable(pool []*reverseproxy.Upstream, avoid string) *reverseproxy.Upstream {
	var chosen, avoided *reverseproxy.Upstream
	n := 0
	for _, u := range pool {
		if !u.Available() {
			continue
		}
		if u.Dial == avoid {
			avoided = u
			continue
		}
		n++
		if rand.IntN(n) == 0 {
			chosen = u
		}
	}
	if chosen == nil {
		return avoided
	}
	return chosen
}
