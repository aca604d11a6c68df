package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// Version is the wire format version this package writes and the only one it
// reads. It is a major version: additions that old readers can ignore (new
// optional fields) keep it; a change they would misread bumps it, and readers
// reject versions they do not know with ErrUnsupportedVersion.
const Version = 1

// Kind tells whether an instance came online or went offline. On the wire it
// is the last token of the subject, and optionally the "kind" field of the
// payload. The zero Kind means "not stated": a payload without "kind" decodes
// to it, and DecodeMessage fills it in from the subject.
type Kind uint8

// The kinds of events.
const (
	Online Kind = iota + 1
	Offline
)

// String returns "online" or "offline", the spelling used in subjects and
// payloads; other values give "Kind(n)".
func (k Kind) String() string {
	switch k {
	case Online:
		return "online"
	case Offline:
		return "offline"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ParseKind parses "online" or "offline". The error wraps ErrInvalidField.
func ParseKind(s string) (Kind, error) {
	switch s {
	case "online":
		return Online, nil
	case "offline":
		return Offline, nil
	}
	return 0, fmt.Errorf("%w: kind %q is neither \"online\" nor \"offline\"", ErrInvalidField, s)
}

// Event is one announcement of an instance of a service.
//
// The zero Event is not valid: Service, InstanceID, Incarnation and At are
// required. Compare events with Equal, not ==, since At is a time.Time.
type Event struct {
	// Kind is Online, Offline or zero (not stated in the payload). Encode
	// writes it as "kind" when it is set; the subject is authoritative.
	Kind Kind

	// Service is the service name, a single NATS token (ValidateService).
	// JSON "service".
	Service string

	// InstanceID is the opaque ID of the instance (ValidateInstanceID).
	// JSON "instanceId".
	InstanceID string

	// Incarnation is positive and grows with every start of the instance,
	// e.g. its start time in Unix nanoseconds. Per instance, an event with a
	// lower incarnation than one already seen is stale. JSON "incarnation",
	// an integer.
	Incarnation int64

	// At is when the event was made. Encode writes it as RFC 3339 in UTC with
	// nanoseconds; Decode accepts any RFC 3339 offset and keeps it. JSON
	// "at".
	At time.Time

	// Reason optionally says why an instance went offline ("shutdown",
	// "crash", ...). At most MaxReasonLength bytes; not allowed on Online
	// events. JSON "reason".
	Reason string

	// Region optionally names the region of the instance (its registry
	// record's region, announce -region): at most MaxRegionLength bytes of
	// valid UTF-8, as a record's region. Empty means not stated: a receiver
	// takes the event as of its own region, as events of announcers that
	// predate regions are. A receiver with a region ignores events that
	// name another (docs/protocol.md, "Regions"). JSON "region", written
	// only when set.
	Region string
}

// Validate checks e against the wire protocol's rules. The error wraps
// ErrMissingField, ErrInvalidField, ErrInvalidService or ErrInvalidInstanceID
// and names the field.
func (e Event) Validate() error {
	if e.Kind != 0 && e.Kind != Online && e.Kind != Offline {
		return fmt.Errorf("%w: kind: unknown value %d", ErrInvalidField, uint8(e.Kind))
	}
	if e.Service == "" {
		return fmt.Errorf("%w: service", ErrMissingField)
	}
	if err := ValidateService(e.Service); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	if e.InstanceID == "" {
		return fmt.Errorf("%w: instanceId", ErrMissingField)
	}
	if err := ValidateInstanceID(e.InstanceID); err != nil {
		return fmt.Errorf("instanceId: %w", err)
	}
	if e.Incarnation <= 0 {
		return fmt.Errorf("%w: incarnation: %d is not positive", ErrInvalidField, e.Incarnation)
	}
	if e.At.IsZero() {
		return fmt.Errorf("%w: at", ErrMissingField)
	}
	// RFC 3339 has four-digit years; Encode writes UTC.
	if y := e.At.UTC().Year(); y < 1 || y > 9999 {
		return fmt.Errorf("%w: at: year %d (in UTC) outside 1..9999", ErrInvalidField, y)
	}
	if len(e.Reason) > MaxReasonLength {
		return fmt.Errorf("%w: reason: %d bytes, limit %d", ErrInvalidField, len(e.Reason), MaxReasonLength)
	}
	if !utf8.ValidString(e.Reason) {
		return fmt.Errorf("%w: reason: not valid UTF-8", ErrInvalidField)
	}
	if e.Reason != "" && e.Kind == Online {
		return fmt.Errorf("%w: reason: only offline events carry a reason", ErrInvalidField)
	}
	if e.Region != "" {
		if err := ValidateRegion(e.Region); err != nil {
			return fmt.Errorf("region: %w", err)
		}
	}
	return nil
}

// Equal reports whether e and o are the same event: equal fields, with At
// compared as an instant (time.Time.Equal).
func (e Event) Equal(o Event) bool {
	return e.Kind == o.Kind && e.Service == o.Service && e.InstanceID == o.InstanceID &&
		e.Incarnation == o.Incarnation && e.At.Equal(o.At) && e.Reason == o.Reason && e.Region == o.Region
}

// wireEvent fixes the order of fields on the wire.
type wireEvent struct {
	V           int       `json:"v"`
	Kind        string    `json:"kind,omitempty"`
	Service     string    `json:"service"`
	InstanceID  string    `json:"instanceId"`
	Incarnation int64     `json:"incarnation"`
	At          time.Time `json:"at"`
	Reason      string    `json:"reason,omitempty"`
	Region      string    `json:"region,omitempty"`
}

// Encode validates e and returns its JSON payload, with "v" set to Version.
func Encode(e Event) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	w := wireEvent{
		V:           Version,
		Service:     e.Service,
		InstanceID:  e.InstanceID,
		Incarnation: e.Incarnation,
		At:          e.At.UTC(),
		Reason:      e.Reason,
		Region:      e.Region,
	}
	if e.Kind != 0 {
		w.Kind = e.Kind.String()
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // '<' in an ID need not grow to \u003c
	if err := enc.Encode(&w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidField, err)
	}
	data := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(data) > MaxPayloadSize {
		// Unreachable with today's limits; kept so a future field cannot
		// make Encode write what Decode refuses.
		return nil, fmt.Errorf("%w: encoded to %d bytes, limit %d", ErrTooLarge, len(data), MaxPayloadSize)
	}
	return data, nil
}

// EncodeMessage validates prefix and e and returns the subject and payload to
// publish. Unlike Encode it requires e.Kind to be Online or Offline, since
// the kind picks the subject.
func EncodeMessage(prefix string, e Event) (subject string, data []byte, err error) {
	if err := ValidatePrefix(prefix); err != nil {
		return "", nil, err
	}
	if e.Kind != Online && e.Kind != Offline {
		return "", nil, fmt.Errorf("%w: kind: must be online or offline to pick a subject", ErrInvalidField)
	}
	data, err = Encode(e)
	if err != nil {
		return "", nil, err
	}
	return Subject(prefix, e.Service, e.Kind), data, nil
}

// Decode parses and validates a payload. Inputs larger than MaxPayloadSize
// fail with ErrTooLarge before any parsing. Field names match exactly (case
// sensitive); unknown fields are ignored; a missing "v" means version 1.
// Decode leaves Kind zero when the payload has no "kind"; use DecodeMessage
// to take it from the subject.
func Decode(data []byte) (Event, error) {
	if len(data) > MaxPayloadSize {
		return Event{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), MaxPayloadSize)
	}
	// encoding/json would silently replace invalid UTF-8 with U+FFFD.
	if !utf8.Valid(data) {
		return Event{}, fmt.Errorf("%w: not valid UTF-8", ErrMalformed)
	}
	// A map rather than a struct: encoding/json matches struct fields case
	// insensitively, and the contract is exact names.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		if typeErr := (*json.UnmarshalTypeError)(nil); errors.As(err, &typeErr) {
			return Event{}, fmt.Errorf("%w: not a JSON object", ErrMalformed)
		}
		return Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if fields == nil { // the input was null
		return Event{}, fmt.Errorf("%w: not a JSON object", ErrMalformed)
	}

	// The version first: another version may shape its fields differently.
	if raw, ok := present(fields, "v"); ok {
		v, ok := jsonInt(raw)
		if !ok {
			return Event{}, typeError("v", "an integer", raw)
		}
		if v != Version {
			return Event{}, fmt.Errorf("%w: v=%d, this decoder reads %d", ErrUnsupportedVersion, v, Version)
		}
	}

	var e Event
	kind, ok, err := stringField(fields, "kind")
	if err != nil {
		return Event{}, err
	}
	if ok {
		if e.Kind, err = ParseKind(kind); err != nil {
			return Event{}, err
		}
	}
	if e.Service, err = requiredString(fields, "service"); err != nil {
		return Event{}, err
	}
	if e.InstanceID, err = requiredString(fields, "instanceId"); err != nil {
		return Event{}, err
	}
	raw, ok := present(fields, "incarnation")
	if !ok {
		return Event{}, fmt.Errorf("%w: incarnation", ErrMissingField)
	}
	if e.Incarnation, ok = jsonInt(raw); !ok {
		return Event{}, typeError("incarnation", "an integer in int64 range", raw)
	}
	at, err := requiredString(fields, "at")
	if err != nil {
		return Event{}, err
	}
	if err := e.At.UnmarshalText([]byte(at)); err != nil {
		return Event{}, fmt.Errorf("%w: at: %q is not an RFC 3339 time", ErrInvalidField, at)
	}
	if e.At.IsZero() {
		return Event{}, fmt.Errorf("%w: at: the zero time", ErrInvalidField)
	}
	if e.Reason, _, err = stringField(fields, "reason"); err != nil {
		return Event{}, err
	}
	if e.Region, _, err = stringField(fields, "region"); err != nil {
		return Event{}, err
	}
	if err := e.Validate(); err != nil {
		return Event{}, err
	}
	return e, nil
}

// DecodeMessage decodes a message received on subject under prefix. It
// checks that the subject has the right shape (ErrBadSubject) and that the
// payload agrees with it on the service and, when the payload states one, the
// kind (ErrMismatch). The returned event's Kind is the subject's.
func DecodeMessage(prefix, subject string, data []byte) (Event, error) {
	service, kind, err := ParseSubject(prefix, subject)
	if err != nil {
		return Event{}, err
	}
	e, err := Decode(data)
	if err != nil {
		return Event{}, err
	}
	if e.Service != service {
		return Event{}, fmt.Errorf("%w: subject %q has service %q, payload %q", ErrMismatch, subject, service, e.Service)
	}
	if e.Kind != 0 && e.Kind != kind {
		return Event{}, fmt.Errorf("%w: subject %q is %s, payload kind %s", ErrMismatch, subject, kind, e.Kind)
	}
	if kind == Online && e.Reason != "" {
		return Event{}, fmt.Errorf("%w: reason: only offline events carry a reason", ErrInvalidField)
	}
	e.Kind = kind
	return e, nil
}

// present returns the raw value of a field that is there and not null.
func present(fields map[string]json.RawMessage, name string) (json.RawMessage, bool) {
	raw, ok := fields[name]
	if !ok || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

func stringField(fields map[string]json.RawMessage, name string) (string, bool, error) {
	raw, ok := present(fields, name)
	if !ok {
		return "", false, nil
	}
	if raw[0] != '"' {
		return "", false, typeError(name, "a string", raw)
	}
	// Most strings have no escapes; their bytes are the value. (The input
	// is valid JSON in valid UTF-8, so no raw control characters either.)
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), true, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, typeError(name, "a string", raw)
	}
	return s, true, nil
}

// jsonInt parses a JSON number that is an integer in int64 range. raw comes
// from a valid JSON document, so ParseInt sees JSON's number grammar only.
func jsonInt(raw json.RawMessage) (int64, bool) {
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

func requiredString(fields map[string]json.RawMessage, name string) (string, error) {
	s, ok, err := stringField(fields, name)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("%w: %s", ErrMissingField, name)
	}
	return s, nil
}

func typeError(name, want string, raw json.RawMessage) error {
	return fmt.Errorf("%w: %s: want %s, got %s", ErrMalformed, name, want, jsonType(raw))
}

// jsonType names the JSON type of a well-formed value for error messages.
func jsonType(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch c := raw[0]; {
	case c == '"':
		return "a string"
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	}
	if len(raw) > 32 {
		return "a number"
	}
	return "the number " + string(raw)
}
