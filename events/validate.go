package events

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits of the wire protocol, in bytes.
const (
	// MaxPayloadSize is the largest payload Decode accepts. A valid event
	// always encodes well below it.
	MaxPayloadSize = 4 << 10

	// MaxServiceLength bounds a service name.
	MaxServiceLength = 128

	// MaxInstanceIDLength bounds an instance ID.
	MaxInstanceIDLength = 256

	// MaxReasonLength bounds the optional reason of an offline event.
	MaxReasonLength = 256

	// MaxRegionLength bounds the optional region of an event: the bound of
	// a registry record's zone and region.
	MaxRegionLength = 128
)

// ValidateService reports whether s can be a service name: a single NATS
// token of 1 to MaxServiceLength bytes, each one of [A-Za-z0-9_-]. The rule
// keeps '.', '*', '>' and spaces out so a service name never changes the
// shape of a subject, and it also makes the name a valid registry key token.
// The error wraps ErrInvalidService.
func ValidateService(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty", ErrInvalidService)
	}
	if len(s) > MaxServiceLength {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidService, len(s), MaxServiceLength)
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return fmt.Errorf("%w: %q: byte %q at offset %d is not one of [A-Za-z0-9_-]", ErrInvalidService, s, s[i], i)
		}
	}
	return nil
}

// ValidateInstanceID reports whether id can be an instance ID. IDs are
// opaque: any valid UTF-8 string of 1 to MaxInstanceIDLength bytes without
// control characters (Unicode category Cc), so Eureka-style
// "host:service:port" IDs, IP addresses, paths and spaces are all fine. The
// error wraps ErrInvalidInstanceID.
func ValidateInstanceID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidInstanceID)
	}
	if len(id) > MaxInstanceIDLength {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidInstanceID, len(id), MaxInstanceIDLength)
	}
	for i, r := range id {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(id[i:]); size == 1 {
				return fmt.Errorf("%w: %q: invalid UTF-8 at offset %d", ErrInvalidInstanceID, id, i)
			}
		}
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %q: control character %U at offset %d", ErrInvalidInstanceID, id, r, i)
		}
	}
	return nil
}

// ValidateRegion reports whether r can be an event's region: 1 to
// MaxRegionLength bytes of valid UTF-8, the rule of a registry record's
// region (and zone). The empty region, "not stated", is valid in an Event
// but not here. The error wraps ErrInvalidField.
func ValidateRegion(r string) error {
	if r == "" {
		return fmt.Errorf("%w: empty region", ErrInvalidField)
	}
	if len(r) > MaxRegionLength {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidField, len(r), MaxRegionLength)
	}
	if !utf8.ValidString(r) {
		return fmt.Errorf("%w: %.40q: not valid UTF-8", ErrInvalidField, r)
	}
	return nil
}

// ValidatePrefix reports whether prefix can start pushlb's subjects: one or
// more tokens of [A-Za-z0-9_-] separated by single dots, such as "lb" or
// "prod.lb". The error wraps ErrInvalidPrefix.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: empty", ErrInvalidPrefix)
	}
	tokenStart := 0
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		switch {
		case c == '.':
			if i == tokenStart {
				return fmt.Errorf("%w: %q: empty token at offset %d", ErrInvalidPrefix, prefix, i)
			}
			tokenStart = i + 1
		case !isTokenByte(c):
			return fmt.Errorf("%w: %q: byte %q at offset %d is not one of [A-Za-z0-9_-.]", ErrInvalidPrefix, prefix, c, i)
		}
	}
	if tokenStart == len(prefix) {
		return fmt.Errorf("%w: %q: ends with '.'", ErrInvalidPrefix, prefix)
	}
	return nil
}

func isTokenByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// MaxIncarnationAhead bounds how far an incarnation may lie in the future of
// the receiver's clock. Incarnations are start times in Unix nanoseconds by
// convention, so a real one is at most the clock skew between two hosts
// ahead; an incarnation beyond now + MaxIncarnationAhead can only be forged
// (or a mistake) and would shut out every later life of the instance.
// Incarnations that are not times (counters, milliseconds x 10^6) lie far in
// the past and always pass.
const MaxIncarnationAhead = time.Hour

// CheckIncarnation reports whether incarnation inc is acceptable to a
// receiver whose clock reads now: at most now + MaxIncarnationAhead in Unix
// nanoseconds. The error wraps ErrFutureIncarnation. Decode does not apply
// it (decoding is a pure function of the payload); receivers call it.
func CheckIncarnation(inc int64, now time.Time) error {
	if limit := now.UnixNano() + int64(MaxIncarnationAhead); inc > limit {
		return fmt.Errorf("%w: incarnation %d is %v ahead of this host's clock (limit %v)",
			ErrFutureIncarnation, inc, time.Duration(inc-now.UnixNano()).Round(time.Second), MaxIncarnationAhead)
	}
	return nil
}
