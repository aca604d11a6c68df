package lbconfig

// The lexer of .properties files: java.util.Properties' syntax (natural
// and logical lines, comments, continuations, key/value separators,
// escapes), read into key/value pairs for ribbonConfig (properties.go).

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/pushlb/pushlb/balancer"
)

// property is one key/value pair of a .properties file.
type property struct {
	key, value string
	line       int // of the key's first natural line
}

// readProperties parses a .properties file as java.util.Properties.load
// does. A later duplicate key replaces an earlier one; the result is in
// file order of the keys' last occurrence.
func readProperties(data []byte) ([]property, error) {
	var text string
	if utf8.Valid(data) {
		text = string(data)
	} else {
		runes := make([]rune, len(data))
		for i, b := range data {
			runes[i] = rune(b) // ISO-8859-1 maps each byte to the same code point
		}
		text = string(runes)
	}
	text = strings.TrimPrefix(text, "\uFEFF")
	lines := splitNaturalLines(text)
	var props []property
	var replaced []bool
	last := make(map[string]int)
	for i := 0; i < len(lines); i++ {
		lineNo := i + 1
		l := trimLeadingSpace(lines[i])
		if l == "" || l[0] == '#' || l[0] == '!' {
			continue // a comment line is never continued
		}
		// A continuation's backslashes are counted on its own natural line,
		// as Java's LineReader does.
		for cont := endsInContinuation(l); cont; {
			l = l[:len(l)-1]
			if i+1 == len(lines) {
				break
			}
			i++
			next := trimLeadingSpace(lines[i])
			l += next
			cont = endsInContinuation(next)
		}
		rawKey, rawValue := splitKeyValue(l)
		key, err := unescapeProperty(rawKey)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: key %q: %w", balancer.ErrInvalidConfig, lineNo, rawKey, err)
		}
		value, err := unescapeProperty(rawValue)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %s: value %q: %w", balancer.ErrInvalidConfig, lineNo, key, rawValue, err)
		}
		if j, dup := last[key]; dup {
			replaced[j] = true
		}
		last[key] = len(props)
		props = append(props, property{key: key, value: value, line: lineNo})
		replaced = append(replaced, false)
	}
	out := props[:0]
	for i, p := range props {
		if !replaced[i] {
			out = append(out, p)
		}
	}
	return out, nil
}

// splitNaturalLines splits at \n, \r\n and \r, as Java's LineReader does.
func splitNaturalLines(s string) []string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	return strings.Split(s, "\n")
}

func isPropertySpace(c byte) bool { return c == ' ' || c == '\t' || c == '\f' }

func trimLeadingSpace(s string) string {
	i := 0
	for i < len(s) && isPropertySpace(s[i]) {
		i++
	}
	return s[i:]
}

// endsInContinuation reports whether s ends in an odd number of
// backslashes: the last one escapes the line end.
func endsInContinuation(s string) bool {
	n := 0
	for i := len(s) - 1; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// splitKeyValue splits a logical line: the key runs up to the first
// unescaped '=', ':' or whitespace; then whitespace, at most one '=' or ':',
// and whitespace separate it from the value.
func splitKeyValue(l string) (key, value string) {
	i := 0
	for i < len(l) {
		c := l[i]
		if c == '\\' {
			i += 2
			continue
		}
		if c == '=' || c == ':' {
			return l[:i], trimLeadingSpace(l[i+1:])
		}
		if isPropertySpace(c) {
			rest := trimLeadingSpace(l[i:])
			if rest != "" && (rest[0] == '=' || rest[0] == ':') {
				rest = trimLeadingSpace(rest[1:])
			}
			return l[:i], rest
		}
		i++
	}
	return l, ""
}

// unescapeProperty resolves \uXXXX (surrogate pairs included), \t, \n, \r,
// \f, and drops the backslash before any other character.
func unescapeProperty(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	var high rune // a pending high surrogate
	flush := func() {
		if high != 0 {
			b.WriteRune(utf8.RuneError)
			high = 0
		}
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			flush()
			if c != '\\' {
				b.WriteByte(c)
			}
			i++
			continue
		}
		c = s[i+1]
		i += 2
		if c != 'u' {
			flush()
			switch c {
			case 't':
				b.WriteByte('\t')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 'f':
				b.WriteByte('\f')
			default:
				b.WriteByte(c)
			}
			continue
		}
		if i+4 > len(s) {
			return "", errors.New(`malformed \uXXXX escape`)
		}
		v, err := strconv.ParseUint(s[i:i+4], 16, 16)
		if err != nil {
			return "", fmt.Errorf(`malformed \uXXXX escape %q`, `\u`+s[i:i+4])
		}
		i += 4
		r := rune(v)
		switch {
		case utf16.IsSurrogate(r) && r < 0xDC00:
			flush()
			high = r
		case utf16.IsSurrogate(r) && high != 0:
			b.WriteRune(utf16.DecodeRune(high, r))
			high = 0
		default:
			flush()
			b.WriteRune(r)
		}
	}
	flush()
	return b.String(), nil
}
