package lbhttp

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/pushlb/pushlb/balancer"
)

// Hints say where a request carries hints for the balancer: a zone to
// prefer (balancer.WithZone), a key for keyed rules (balancer.WithKey) and
// a hint naming a group of instances (balancer.WithHint); and which subset
// of the instances a route sends its requests to (Subsets). The Proxy
// reads them from each request of a route and puts them on the request's
// context, so that a client of the gateway can steer its request to a
// zone, a group, or stick to one instance, without the gateway knowing it
// in advance. The zero value reads the hint header DefaultHintHeader and
// nothing else.
type Hints struct {
	// ZoneHeader names a request header whose value is the zone to prefer
	// for that request, as Spring Cloud LoadBalancer's hint header
	// (spring.cloud.loadbalancer.hint-header-name) names an instance
	// group: only instances of that zone are chosen while it has a usable
	// one (alive, breaker closed); otherwise the usual choice applies.
	// Zones compare case-insensitively. A request without the header, or
	// with an empty value, gets no zone hint. Empty: no zone hint.
	ZoneHeader string `yaml:"zoneHeader"`
	// HashKey is the part of the request that is its key, for keyed rules
	// (the Rendezvous rule: equal keys go to the same instance while it is
	// available, so sessions stick). The zero value takes no key.
	HashKey HashKey `yaml:"hashKey"`
	// HintHeader names a request header whose value is the request's hint
	// (balancer.WithHint): instances announced with metadata hint=<value>
	// serve it, and when none is alive the request goes where it would
	// without the header, as Spring Cloud LoadBalancer's X-SC-LB-Hint
	// does. Empty: DefaultHintHeader; "-": no hint header.
	HintHeader string `yaml:"hintHeader"`

	// The route's subsets (subsets.go): its requests go to the instances
	// matching Subset, or are split between subsets by weight (Split), with
	// Fallback when a subset has no alive instance. These are the route's
	// own: WithHints sets them for the default rule only, and routes do
	// not inherit them.
	Subsets `yaml:",inline"`

	// plan is the compiled form of Subsets and HintHeader (compile); env
	// the Proxy's settings for them, shared by every route.
	plan *subsetPlan
	env  *subsetEnv
}

// HashKey names the one part of a request that is its key for keyed rules.
// At most one field is set. A request that lacks that part, or has it
// empty, has no key (Rendezvous then picks round robin).
type HashKey struct {
	// Header takes the value of this request header (its first value).
	Header string `yaml:"header"`
	// Cookie takes the value of this cookie.
	Cookie string `yaml:"cookie"`
	// Query takes the value of this query parameter (its first value).
	Query string `yaml:"query"`
	// ClientIP takes the IP address of the client's connection (behind an
	// HTTP proxy, that proxy's: forwarding headers are not trusted).
	ClientIP bool `yaml:"clientIP"`
}

// IsZero reports whether h takes no key.
func (h HashKey) IsZero() bool { return h == HashKey{} }

// IsZero reports whether h reads no hint and names no subset. The zero
// Hints reads DefaultHintHeader, so it is not zero.
func (h Hints) IsZero() bool {
	return h.ZoneHeader == "" && h.HashKey.IsZero() && h.HintHeader == noHintHeader && h.Subsets.IsZero()
}

// Validate reports a header or cookie name that is not an HTTP token, or
// more than one source of the key. Errors wrap ErrInvalidOption; their
// text names the key at fault ("hashKey.header ...") and nothing else, for
// a configuration file's messages.
func (h Hints) Validate() error {
	if h.ZoneHeader != "" && !isToken(h.ZoneHeader) {
		return hintError("zoneHeader %q is not a valid header name", h.ZoneHeader)
	}
	if h.HintHeader != "" && h.HintHeader != noHintHeader && !isToken(h.HintHeader) {
		return hintError("hintHeader %q is not a valid header name (%q: none)", h.HintHeader, noHintHeader)
	}
	if _, err := h.Subsets.compile(); err != nil {
		return err
	}
	k := h.HashKey
	n := 0
	for _, set := range []bool{k.Header != "", k.Cookie != "", k.Query != "", k.ClientIP} {
		if set {
			n++
		}
	}
	if n > 1 {
		return hintError("hashKey: set one of header, cookie, query or clientIP, not %d", n)
	}
	if k.Header != "" && !isToken(k.Header) {
		return hintError("hashKey.header %q is not a valid header name", k.Header)
	}
	if k.Cookie != "" && !isToken(k.Cookie) {
		return hintError("hashKey.cookie %q is not a valid cookie name", k.Cookie)
	}
	return nil
}

// over returns h with the fields it leaves empty taken from d (its
// Subsets are its own), compiled for requests.
func (h Hints) over(d Hints) Hints {
	if h.ZoneHeader == "" {
		h.ZoneHeader = d.ZoneHeader
	}
	if h.HashKey.IsZero() {
		h.HashKey = d.HashKey
	}
	if h.HintHeader == "" {
		h.HintHeader = d.HintHeader
	}
	h.env = d.env
	h.plan, _ = h.Subsets.compile() // Validate checked it
	return h
}

// context returns r's context with the hints r carries, and whether it
// carries any: a zone, a key, a hint, and the route's subset (its own, or
// the split's share for this request: by the key when there is one, so
// that a key always gets the same subset). service is the routed service,
// for the subset observer.
func (h *Hints) context(r *http.Request, service string) (context.Context, bool) {
	ctx, hinted := r.Context(), false
	if h.ZoneHeader != "" {
		if z := r.Header.Get(h.ZoneHeader); z != "" {
			ctx, hinted = balancer.WithZone(ctx, z), true
		}
	}
	key := h.HashKey.from(r)
	if key != "" {
		ctx, hinted = balancer.WithKey(ctx, key), true
	}
	hint := ""
	if name := h.hintHeader(); name != "" {
		hint = r.Header.Get(name)
	}
	if sub := h.plan.subsetFor(key, h.env); sub != nil || hint != "" {
		ctx, hinted = balancer.WithSubsetHint(ctx, sub, hint), true
		if sub != nil && h.env != nil && h.env.observe != nil {
			h.env.observe(service, sub.String())
		}
	}
	return ctx, hinted
}

// from returns r's key, or "".
func (k HashKey) from(r *http.Request) string {
	switch {
	case k.Header != "":
		return r.Header.Get(k.Header)
	case k.Cookie != "":
		if c, err := r.Cookie(k.Cookie); err == nil {
			return c.Value
		}
	case k.Query != "":
		return r.URL.Query().Get(k.Query)
	case k.ClientIP:
		if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			return ip
		}
	}
	return ""
}

// WithHints sets the hints of the default rule (/<service>/<rest>), and of
// every explicit route for the fields it leaves empty: a route's own
// ZoneHeader, HashKey and HintHeader win over these. Its Subsets apply to
// the default rule only.
func WithHints(h Hints) ProxyOption {
	return func(p *Proxy) error {
		if err := h.Validate(); err != nil {
			return optionError("hints: %v", err)
		}
		h.env = p.hints.env
		h.plan, _ = h.Subsets.compile()
		p.hints = h
		return nil
	}
}

// invalidHint is an error of Hints.Validate.
type invalidHint struct{ msg string }

func hintError(format string, a ...any) error { return &invalidHint{fmt.Sprintf(format, a...)} }

func (e *invalidHint) Error() string { return e.msg }
func (e *invalidHint) Unwrap() error { return ErrInvalidOption }

// isToken reports whether s is an HTTP token (RFC 9110 section 5.6.2), as
// header field and cookie names are.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x80 && c > ' ' && c != 0x7f && !isSeparator(c):
		default:
			return false
		}
	}
	return true
}

func isSeparator(c byte) bool {
	switch c {
	case '"', '(', ')', ',', '/', ':', ';', '<', '=', '>', '?', '@', '[', '\\', ']', '{', '}':
		return true
	}
	return false
}
