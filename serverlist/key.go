package serverlist

import (
	"encoding/base64"
	"errors"
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

// EncodeRegionalKey returns the key of a record copied from another
// region's registry (a [Replicator]'s copy):
//
//	<service>.<base64url-unpadded(instanceId)>=<region>
//
// '=' is outside the base64url alphabet, so a copy's key never equals an
// instance's own key ([EncodeKey]), and one service's copies and own
// records alike match "<service>.*". id is the instance's ID in its own
// region; the copy's record names it [QualifiedID](id, region). The error
// wraps ErrInvalidInstance for an invalid service, ID or region (see
// [ValidateRegion]), or a qualified ID longer than an ID may be.
func EncodeRegionalKey(service, region, id string) (string, error) {
	key, err := EncodeKey(service, id)
	if err != nil {
		return "", err
	}
	if err := ValidateRegion(region); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidInstance, err)
	}
	// The copy names the qualified ID, which must be a valid ID too (an
	// ID near the length limit has no room for its region).
	if err := validateInstanceID(QualifiedID(id, region)); err != nil {
		return "", err
	}
	return key + regionSeparator + region, nil
}

// regionSeparator ends the encoded ID of a regional key
// ([EncodeRegionalKey]) and starts its region.
const regionSeparator = "="

// QualifiedID is the instance ID a region's copy of another region's
// record carries: "<id>@<region>", so that two regions' instances of one
// ID stay apart in a list and a balancer. An instance whose own ID looks
// the same ("x@eu" registered in its own region) is a different record
// under a different key: where both exist, the own record wins (see
// [Mirror]).
func QualifiedID(id, region string) string { return id + "@" + region }

// maxRegionLen bounds a region's name in a key.
const maxRegionLen = 64

// ValidateRegion reports whether name can name a region in a registry key
// ([EncodeRegionalKey]) and a replication: 1 to 64 of [A-Za-z0-9_-].
// Stricter than a record's or an event's region field
// (events.ValidateRegion: up to 128 bytes of UTF-8): the regions that
// copy each other's records need names that fit in a key.
func ValidateRegion(name string) error {
	if name == "" {
		return errors.New("region: empty")
	}
	if len(name) > maxRegionLen {
		return fmt.Errorf("region %q: longer than %d bytes", name, maxRegionLen)
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("region %q: only letters, digits, '_' and '-'", name)
		}
	}
	return nil
}

// IsRegionalKey reports whether key is the key of another region's record
// copied into this registry ([EncodeRegionalKey]): never leased, renewed
// or reaped here; only a [Replicator] writes it.
func IsRegionalKey(key string) bool {
	_, enc, ok := strings.Cut(key, ".")
	return ok && strings.Contains(enc, regionSeparator)
}

// DecodeKey is the inverse of [EncodeKey] and [EncodeRegionalKey]. It
// accepts only keys they can produce (canonical encoding, valid service,
// ID and region), so that each key decodes to one instance: a regional
// key's ID is the qualified one ([QualifiedID]). Errors wrap ErrInvalidKey.
func DecodeKey(key string) (service, id string, err error) {
	service, id, _, err = decodeKey(key)
	return service, id, err
}

// decodeKey is DecodeKey that also tells a regional key.
func decodeKey(key string) (service, id string, regional bool, err error) {
	service, enc, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", false, fmt.Errorf("%w: %q has no '.'", ErrInvalidKey, key)
	}
	if err := validateService(service); err != nil {
		return "", "", false, fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
	}
	enc, region, regional := strings.Cut(enc, regionSeparator)
	if regional {
		if err := ValidateRegion(region); err != nil {
			return "", "", false, fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
		}
	}
	raw, err := keyEncoding.DecodeString(enc)
	if err != nil {
		return "", "", false, fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
	}
	// The decoder skips '\r' and '\n'; a length check keeps keys canonical.
	if keyEncoding.EncodedLen(len(raw)) != len(enc) {
		return "", "", false, fmt.Errorf("%w: %q: not canonical base64url", ErrInvalidKey, key)
	}
	id = string(raw)
	if err := validateInstanceID(id); err != nil {
		return "", "", false, fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
	}
	if regional {
		id = QualifiedID(id, region)
		if err := validateInstanceID(id); err != nil {
			return "", "", false, fmt.Errorf("%w: %q: %w", ErrInvalidKey, key, err)
		}
	}
	return service, id, regional, nil
}
