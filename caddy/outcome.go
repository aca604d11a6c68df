package pushlbcaddy

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/pushlb/pushlb/balancer"
)

// attempt is the pick of a request's current attempt, kept in the
// request's variables until the next attempt or the request's end reports
// its outcome.
type attempt struct {
	mu   sync.Mutex
	pick balancer.Pick
	dial string // the upstream of the last attempt
	repl *caddy.Replacer
	over bool // the request's context ended: later picks end at once
}

// lastDial returns the address of the request's last attempt, "" for
// none. a may be nil. Only the request's goroutine calls it.
func (a *attempt) lastDial() string {
	if a == nil {
		return ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dial
}

// attemptVar is the request variable holding the *attempt.
const attemptVar = "pushlb.attempt"

// The placeholders reverse_proxy sets once an upstream answered.
const (
	statusPlaceholder  = "http.reverse_proxy.status_code"
	latencyPlaceholder = "http.reverse_proxy.upstream.latency"
)

// track ends the request's previous attempt (a is nil for the first) and
// starts p's.
func track(r *http.Request, a *attempt, p balancer.Pick, u *reverseproxy.Upstream) {
	ctx := r.Context()
	repl, _ := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		p.End() // not a Caddy request (a test calling Select): nothing to learn
		return
	}
	if a == nil {
		a = &attempt{repl: repl}
		caddyhttp.SetVar(ctx, attemptVar, a)
		context.AfterFunc(ctx, a.end)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.over {
		p.End()
		return
	}
	a.report()
	// The placeholders now tell whether this attempt got an answer.
	repl.Delete(statusPlaceholder)
	repl.Delete(latencyPlaceholder)
	a.pick, a.dial = p, u.Dial
}

// finish reports the outcome of the current attempt, if not yet done.
// a may be nil.
func (a *attempt) finish() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.report()
}

// end reports the last attempt when the request is over.
func (a *attempt) end() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.report()
	a.over = true
}

// report reports the outcome of the current attempt, once. a.mu is held.
func (a *attempt) report() {
	if a.pick.Server == nil {
		return
	}
	p := a.pick
	a.pick = balancer.Pick{}
	if st, answered := a.repl.Get(statusPlaceholder); answered {
		latency, _ := a.repl.Get(latencyPlaceholder)
		d, _ := latency.(time.Duration)
		code, _ := st.(int)
		p.Done(balancer.DoneInfo{ResponseTime: d, ServerError: code >= 500})
		return
	}
	p.Done(balancer.DoneInfo{Err: errNoResponse, ConnectFailure: true})
}

// errNoResponse is the outcome of an attempt that got no response.
var errNoResponse = errors.New("pushlb: no response from the upstream")
