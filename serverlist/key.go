package serverlist

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// keyEncoding is RFC 4648 §5 base64url without padding, strict so that every
// ID has exactly one key. Its alphabet [A-Za-z0-9_-] is a subset of what KV
// keys allow ([-/_=.a-zA-Z0-9]) and holds no '.', so the key splits
// unambiguously at its only dot.
var keyEncoding = base64.RawURLEncoding.Strict()

// EncodeKey returns the registry key of an instance:
//
//	<service>.<base64url-unpadded(instanceId)>
//
// Instance IDs are opaque and may contain ':', '.', '/', spaces or any
// Unicode, none of which a KV key can hold verbatim, hence the encoding
// (RFC 4648 §5, no padding). Service names are NATS-token safe and are kept
// readable, so one service's keys match the filter "<service>.*".
// It returns an error wrapping ErrInvalidInstance if the service or the ID is
// invalid (see [Instance.Validate]).
func EncodeKey(service, id string) (string, error) {
	if err := validateService(service); err != nil {
		return "", err
	}
	if err := validateInstanceID(id); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(service) + 1 + keyEncoding.EncodedLen(len(id)))
	b.WriteString(service)
	b.WriteByte('.')
	b.WriteString(keyEncoding.EncodeToString([]byte(id)))
	return b.String(), nil
}

// DecodeKey is the inverse of [EncodeKey]. It accepts only keys EncodeKey
// can produce (canonical encoding, valid service and ID), so
// EncodeKey(DecodeKey(k)) == k for every key it accepts. Errors wrap
// ErrInvalidKey.
func DecodeKey(key string) (service, id string, err error) {
	service, enc, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", fmt.Errorf("%w: %q has no '.'", ErrInvalidKey, key)
	}
	if err := validateService(service); err != nil {
		return "", "", fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
	}
	raw, err := keyEncoding.DecodeString(enc)
	if err != nil {
		return "", "", fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
	}
	// The decoder skips '\r' and '\n'; a length check keeps keys canonical.
	if keyEncoding.EncodedLen(len(raw)) != len(enc) {
		return "", "", fmt.Errorf("%w: %q: not canonical base64url", ErrInvalidKey, key)
	}
	id = string(raw)
	if err := validateInstanceID(id); err != nil {
		return "", "", fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
	}
	return service, id, nil
}
