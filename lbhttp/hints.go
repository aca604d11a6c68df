package lbhttp

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/pushlb/pushlb/balancer"
)

// Hints say where a request carries hints for the balancer: a zone to
// prefer (balancer.WithZone) and a key for keyed rules (balancer.WithKey).
// The Proxy reads them from each request of a route and puts them on the
// request's context, so that a client of the gateway can steer its request
// to a zone, or stick to one instance, without the gateway knowing it in
// advance. The zero value reads no hint.
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

// IsZero reports whether h reads no hint.
func (h Hints) IsZero() bool { return h == Hints{} }

// Validate reports a header or cookie name that is not an HTTP token, or
// more than one source of the key. Errors wrap ErrInvalidOption; their
// text names the key at fault ("hashKey.header ...") and nothing else, for
// a configuration file's messages.
func (h Hints) Validate() error {
	if h.ZoneHeader != "" && !isToken(h.ZoneHeader) {
		return hintError("zoneHeader %q is not a valid header name", h.ZoneHeader)
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

// over returns h with the fields it leaves empty taken from d.
func (h Hints) over(d Hints) Hints {
	if h.ZoneHeader == "" {
		h.ZoneHeader = d.ZoneHeader
	}
	if h.HashKey.IsZero() {
		h.HashKey = d.HashKey
	}
	return h
}

// context returns r's context with the hints r carries, and whether it
// carries any.
func (h *Hints) context(r *http.Request) (context.Context, bool) {
	ctx, hinted := r.Context(), false
	if h.ZoneHeader != "" {
		if z := r.Header.Get(h.ZoneHeader); z != "" {
			ctx, hinted = balancer.WithZone(ctx, z), true
		}
	}
	if key := h.HashKey.from(r); key != "" {
		ctx, hinted = balancer.WithKey(ctx, key), true
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
// ZoneHeader and HashKey win over these.
func WithHints(h Hints) ProxyOption {
	return func(p *Proxy) error {
		if err := h.Validate(); err != nil {
			return optionError("hints: %v", err)
		}
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
