package lbhttp

// Path cleaning, before routing: removing dot-segments and empty segments
// (RFC 3986 section 5.2.4), and refusing the escapes, backslashes and path
// parameters that could hide a dot-segment from that. Proxy's
// documentation (# Paths) states the rules.

import "strings"

// cleanPath returns the escaped path without dot-segments and empty
// segments, or false when a ".." climbs above the root or removes a
// segment of the route's prefix: the route of the clean path must be the
// one the path names as written, with its ".." segments taken literally,
// and no ".." may leave fewer segments than that route's prefix has.
func (p *Proxy) cleanPath(path string) (string, bool) {
	clean, literal, lowest, ok := removeDotSegments(path)
	if !ok {
		return "", false
	}
	if lowest < 0 {
		return clean, true // only "." and empty segments: nothing climbs
	}
	m, ok := p.route(clean)
	if !ok || lowest < m.depth {
		return "", false
	}
	if lm, ok := p.route(literal); !ok || lm.service != m.service || lm.prefix != m.prefix {
		return "", false
	}
	return clean, true
}

// needsCleaning reports whether an escaped path has an empty segment
// (other than a trailing one), a "." or ".." segment, an escaped dot, an
// escaped slash or backslash, a backslash or a ';'. It does not allocate:
// most paths are clean.
func needsCleaning(path string) bool {
	if !strings.HasPrefix(path, "/") {
		return false
	}
	rest := path[1:]
	for {
		seg, more, found := strings.Cut(rest, "/")
		if (seg == "" && found) || seg == "." || seg == ".." || suspicious(seg) {
			return true
		}
		if !found {
			return false
		}
		rest = more
	}
}

// suspicious reports whether a segment holds something that may hide a
// dot-segment: "%2e", "%2f", "%5c" (any case), '\' or ';'.
func suspicious(seg string) bool {
	for i := 0; i < len(seg); i++ {
		switch seg[i] {
		case '\\', ';':
			return true
		case '%':
			if escapedDot(seg, i) || escapedSeparator(seg, i) > 0 {
				return true
			}
		}
	}
	return false
}

// escapedDot reports whether s[i:] starts with "%2e" or "%2E".
func escapedDot(s string, i int) bool {
	return i+2 < len(s) && s[i] == '%' && s[i+1] == '2' && (s[i+2] == 'e' || s[i+2] == 'E')
}

// escapedSeparator returns the length of the separator a service might
// decode and split on at s[i:]: 1 for '\\', 3 for "%2f" or "%5c" (any
// case), else 0.
func escapedSeparator(s string, i int) int {
	switch {
	case s[i] == '\\':
		return 1
	case s[i] != '%' || i+2 >= len(s):
		return 0
	case s[i+1] == '2' && (s[i+2] == 'f' || s[i+2] == 'F'),
		s[i+1] == '5' && (s[i+2] == 'c' || s[i+2] == 'C'):
		return 3
	}
	return 0
}

// hidesDotSegment reports whether a segment (its dots decoded) holds a
// dot-segment behind an escaped slash, a backslash or a path parameter:
// "..%2Fx", "a%5C..", "..;x". A service that splits on those before it
// cleans its path would climb.
func hidesDotSegment(seg string) bool {
	part := 0
	for i := 0; ; {
		n := 0
		if i < len(seg) {
			if n = escapedSeparator(seg, i); n == 0 {
				i++
				continue
			}
		}
		p, _, _ := strings.Cut(seg[part:i], ";")
		if p == "." || p == ".." {
			return true
		}
		if i == len(seg) {
			return false
		}
		i += n
		part = i
	}
}

// removeDotSegments applies RFC 3986's remove_dot_segments to an escaped
// path, reading "%2e" and "%2E" as ".", and drops empty segments (as
// nginx's merge_slashes does). A path ending in "/", "." or ".." keeps a
// trailing "/". It also returns literal, the path with the ".." segments
// kept, and lowest, the fewest segments a ".." left (-1 without any); ok
// is false when a ".." climbs above the root.
func removeDotSegments(path string) (clean, literal string, lowest int, ok bool) {
	var segs, lit []string
	lowest = -1
	trailing := false
	rest := path[1:]
	for {
		seg, more, found := strings.Cut(rest, "/")
		if !validEscapes(seg) {
			return "", "", 0, false
		}
		seg = decodeDots(seg)
		if seg != "." && seg != ".." && hidesDotSegment(seg) {
			return "", "", 0, false
		}
		switch seg {
		case "", ".":
			trailing = true
		case "..":
			if len(segs) == 0 {
				return "", "", 0, false
			}
			segs = segs[:len(segs)-1]
			if lowest < 0 || len(segs) < lowest {
				lowest = len(segs)
			}
			lit = append(lit, seg)
			trailing = true
		default:
			segs = append(segs, seg)
			lit = append(lit, seg)
			trailing = false
		}
		if !found {
			break
		}
		rest = more
	}
	return joinSegments(segs, trailing), joinSegments(lit, trailing), lowest, true
}

func joinSegments(segs []string, trailing bool) string {
	s := "/" + strings.Join(segs, "/")
	if trailing && len(segs) > 0 {
		s += "/"
	}
	return s
}

// validEscapes reports whether every '%' of an escaped segment starts an
// escape of two hex digits. A request's URL must hold no other (net/http
// answers 400 before a handler runs); the proxy refuses them as well, so
// that a stray '%' can never make it read what follows as an escape and
// hide a dot-segment behind it.
func validEscapes(seg string) bool {
	for i := 0; i < len(seg); i++ {
		if seg[i] != '%' {
			continue
		}
		if i+2 >= len(seg) || !isHex(seg[i+1]) || !isHex(seg[i+2]) {
			return false
		}
		i += 2
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// decodeDots replaces "%2e" and "%2E" in an escaped segment by ".".
func decodeDots(seg string) string {
	if !strings.Contains(seg, "%2e") && !strings.Contains(seg, "%2E") {
		return seg
	}
	var b strings.Builder
	for i := 0; i < len(seg); i++ {
		switch {
		case escapedDot(seg, i):
			b.WriteByte('.')
			i += 2
		case seg[i] == '%' && i+2 < len(seg):
			b.WriteString(seg[i : i+3]) // another escape, kept whole
			i += 2
		default:
			b.WriteByte(seg[i])
		}
	}
	return b.String()
}
