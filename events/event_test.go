package events

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// checkCovered fails if a testdata file matching pattern has no test case,
// so a sample added to testdata/ cannot go untested.
func checkCovered[V any](t *testing.T, pattern string, cases map[string]V) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", pattern))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, ok := cases[filepath.Base(f)]; !ok {
			t.Errorf("testdata/%s has no case in this test", filepath.Base(f))
		}
	}
}

func TestDecodeGoodTestdata(t *testing.T) {
	cases := map[string]Event{
		"good-online.json": {
			Kind: Online, Service: "orders", InstanceID: "10.0.0.5:orders:8080",
			Incarnation: 1732886400000000000, At: mustTime(t, "2024-11-29T13:20:00.123456789Z"),
		},
		"good-offline.json": {
			Kind: Offline, Service: "orders", InstanceID: "10.0.0.5:orders:8080",
			Incarnation: 1732886400000000000, At: mustTime(t, "2024-11-29T14:05:07Z"), Reason: "shutdown",
		},
		"good-minimal.json": {
			Service: "orders", InstanceID: "i-1", Incarnation: 1, At: mustTime(t, "2024-11-29T13:20:00Z"),
		},
		"good-region.json": {
			Kind: Offline, Service: "orders", InstanceID: "orders-1", Incarnation: 1732886400000000000,
			At: mustTime(t, "2024-11-29T14:05:07Z"), Reason: "shutdown", Region: "eu-west",
		},
		"good-unknown-fields.json": {
			Service: "billing-api_v2", InstanceID: "pod/billing 7.eu-west", Incarnation: 42,
			At: mustTime(t, "2024-11-29T13:20:00Z"),
		},
	}
	checkCovered(t, "good-*.json", cases)
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Decode(readTestdata(t, name))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !got.Equal(want) {
				t.Fatalf("Decode = %+v, want %+v", got, want)
			}
		})
	}
}

func TestDecodeBadTestdata(t *testing.T) {
	type want struct {
		err   error
		field string // must appear in the message; "" for none
	}
	cases := map[string]want{
		"bad-truncated.json":           {ErrMalformed, ""},
		"bad-array.json":               {ErrMalformed, "object"},
		"bad-null.json":                {ErrMalformed, "object"},
		"bad-incarnation-string.json":  {ErrMalformed, "incarnation"},
		"bad-incarnation-float.json":   {ErrMalformed, "incarnation"},
		"bad-incarnation-zero.json":    {ErrInvalidField, "incarnation"},
		"bad-missing-service.json":     {ErrMissingField, "service"},
		"bad-missing-instance-id.json": {ErrMissingField, "instanceId"},
		"bad-missing-incarnation.json": {ErrMissingField, "incarnation"},
		"bad-missing-at.json":          {ErrMissingField, "at"},
		"bad-at-not-rfc3339.json":      {ErrInvalidField, "at"},
		"bad-service-dot.json":         {ErrInvalidService, "service"},
		"bad-service-wildcard.json":    {ErrInvalidService, "service"},
		"bad-instance-id-control.json": {ErrInvalidInstanceID, "instanceId"},
		"bad-version-2.json":           {ErrUnsupportedVersion, "v=2"},
		"bad-version-string.json":      {ErrMalformed, "v"},
		"bad-reason-on-online.json":    {ErrInvalidField, "reason"},
		"bad-reason-too-long.json":     {ErrInvalidField, "reason"},
		"bad-kind.json":                {ErrInvalidField, "kind"},
		"bad-key-case.json":            {ErrMissingField, "service"},
		"bad-too-large.json":           {ErrTooLarge, ""},
		"bad-region-too-long.json":     {ErrInvalidField, "region"},
		"bad-region-array.json":        {ErrMalformed, "region"},
	}
	checkCovered(t, "bad-*.json", cases)
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(readTestdata(t, name))
			if !errors.Is(err, w.err) {
				t.Fatalf("Decode error = %v, want %v", err, w.err)
			}
			if !strings.Contains(err.Error(), w.field) {
				t.Errorf("error %q does not name %q", err, w.field)
			}
		})
	}
}

// payload builds a valid minimal payload with extra, raw JSON members
// spliced in before the required ones (later duplicates would win).
func payload(extra string) []byte {
	if extra != "" {
		extra += ","
	}
	return []byte(`{` + extra + `"service":"orders","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`)
}

func TestDecode(t *testing.T) {
	at := mustTime(t, "2024-11-29T13:20:00Z")
	base := Event{Service: "orders", InstanceID: "i-1", Incarnation: 7, At: at}
	with := func(f func(*Event)) Event {
		e := base
		f(&e)
		return e
	}
	tests := []struct {
		name string
		data []byte
		want Event
		err  error
	}{
		{name: "minimal", data: payload(""), want: base},
		{name: "version 1", data: payload(`"v":1`), want: base},
		{name: "version null means 1", data: payload(`"v":null`), want: base},
		{name: "version 2", data: payload(`"v":2`), err: ErrUnsupportedVersion},
		{name: "version 0", data: payload(`"v":0`), err: ErrUnsupportedVersion},
		{name: "version -1", data: payload(`"v":-1`), err: ErrUnsupportedVersion},
		{name: "version float", data: payload(`"v":1.5`), err: ErrMalformed},
		{name: "version before other errors", data: []byte(`{"v":3,"service":7}`), err: ErrUnsupportedVersion},
		{name: "unknown fields ignored", data: payload(`"zone":"a","metadata":{"k":"v"},"tags":[1,"x",null],"future":true`), want: base},
		{name: "kind online", data: payload(`"kind":"online"`), want: with(func(e *Event) { e.Kind = Online })},
		{name: "kind offline with reason", data: payload(`"kind":"offline","reason":"deploy 12"`),
			want: with(func(e *Event) { e.Kind, e.Reason = Offline, "deploy 12" })},
		{name: "reason without kind", data: payload(`"reason":"crash"`), want: with(func(e *Event) { e.Reason = "crash" })},
		{name: "reason with newline", data: payload(`"kind":"offline","reason":"line1\nline2"`),
			want: with(func(e *Event) { e.Kind, e.Reason = Offline, "line1\nline2" })},
		{name: "region", data: payload(`"region":"eu-west"`), want: with(func(e *Event) { e.Region = "eu-west" })},
		{name: "region null", data: payload(`"region":null`), want: base},
		{name: "region empty means not stated", data: payload(`"region":""`), want: base},
		{name: "region unicode", data: payload(`"region":"\u00e9t\u00e9 1"`), want: with(func(e *Event) { e.Region = "été 1" })},
		{name: "region at limit", data: payload(`"region":"` + strings.Repeat("r", MaxRegionLength) + `"`),
			want: with(func(e *Event) { e.Region = strings.Repeat("r", MaxRegionLength) })},
		{name: "region too long", data: payload(`"region":"` + strings.Repeat("r", MaxRegionLength+1) + `"`), err: ErrInvalidField},
		{name: "region number", data: payload(`"region":1`), err: ErrMalformed},
		{name: "region object", data: payload(`"region":{}`), err: ErrMalformed},
		{name: "region upper-case key is unknown", data: payload(`"Region":"eu"`), want: base},
		{name: "kind upper case", data: payload(`"kind":"ONLINE"`), err: ErrInvalidField},
		{name: "kind number", data: payload(`"kind":1`), err: ErrMalformed},
		{name: "reason number", data: payload(`"reason":1`), err: ErrMalformed},
		{name: "service number", data: []byte(`{"service":1,"instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrMalformed},
		{name: "service empty", data: []byte(`{"service":"","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrMissingField},
		{name: "service null", data: []byte(`{"service":null,"instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrMissingField},
		{name: "service with space", data: []byte(`{"service":"my svc","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrInvalidService},
		{name: "service star", data: []byte(`{"service":"*","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrInvalidService},
		{name: "service too long", data: []byte(`{"service":"` + strings.Repeat("s", MaxServiceLength+1) + `","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrInvalidService},
		{name: "service at limit", data: []byte(`{"service":"` + strings.Repeat("s", MaxServiceLength) + `","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`),
			want: with(func(e *Event) { e.Service = strings.Repeat("s", MaxServiceLength) })},
		{name: "id with colon dot slash space", data: []byte(`{"service":"orders","instanceId":"10.0.0.5:orders/v2 blue:8080","incarnation":7,"at":"2024-11-29T13:20:00Z"}`),
			want: with(func(e *Event) { e.InstanceID = "10.0.0.5:orders/v2 blue:8080" })},
		{name: "id unicode", data: []byte(`{"service":"orders","instanceId":"nœud-été-\u2603","incarnation":7,"at":"2024-11-29T13:20:00Z"}`),
			want: with(func(e *Event) { e.InstanceID = "nœud-été-☃" })},
		{name: "id at limit", data: []byte(`{"service":"orders","instanceId":"` + strings.Repeat("i", MaxInstanceIDLength) + `","incarnation":7,"at":"2024-11-29T13:20:00Z"}`),
			want: with(func(e *Event) { e.InstanceID = strings.Repeat("i", MaxInstanceIDLength) })},
		{name: "id too long", data: []byte(`{"service":"orders","instanceId":"` + strings.Repeat("i", MaxInstanceIDLength+1) + `","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrInvalidInstanceID},
		{name: "id NUL", data: []byte(`{"service":"orders","instanceId":"a\u0000b","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrInvalidInstanceID},
		{name: "id DEL", data: []byte("{\"service\":\"orders\",\"instanceId\":\"a\x7fb\",\"incarnation\":7,\"at\":\"2024-11-29T13:20:00Z\"}"), err: ErrInvalidInstanceID},
		{name: "id C1 control", data: []byte(`{"service":"orders","instanceId":"a\u0085b","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrInvalidInstanceID},
		{name: "id empty", data: []byte(`{"service":"orders","instanceId":"","incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrMissingField},
		{name: "id object", data: []byte(`{"service":"orders","instanceId":{},"incarnation":7,"at":"2024-11-29T13:20:00Z"}`), err: ErrMalformed},
		{name: "incarnation negative", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":-3,"at":"2024-11-29T13:20:00Z"}`), err: ErrInvalidField},
		{name: "incarnation overflow", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":9223372036854775808,"at":"2024-11-29T13:20:00Z"}`), err: ErrMalformed},
		{name: "incarnation max", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":9223372036854775807,"at":"2024-11-29T13:20:00Z"}`),
			want: with(func(e *Event) { e.Incarnation = 9223372036854775807 })},
		{name: "incarnation exponent", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":1e3,"at":"2024-11-29T13:20:00Z"}`), err: ErrMalformed},
		{name: "incarnation bool", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":true,"at":"2024-11-29T13:20:00Z"}`), err: ErrMalformed},
		{name: "at with offset", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":7,"at":"2024-11-29T14:20:00+01:00"}`), want: base},
		{name: "at number", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":7,"at":1732886400}`), err: ErrMalformed},
		{name: "at without zone", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00"}`), err: ErrInvalidField},
		{name: "at zero time", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":7,"at":"0001-01-01T00:00:00Z"}`), err: ErrInvalidField},
		{name: "at empty", data: []byte(`{"service":"orders","instanceId":"i-1","incarnation":7,"at":""}`), err: ErrInvalidField},
		{name: "invalid UTF-8", data: []byte("{\"service\":\"orders\",\"instanceId\":\"i-\xff\",\"incarnation\":7,\"at\":\"2024-11-29T13:20:00Z\"}"), err: ErrMalformed},
		{name: "trailing data", data: append(payload(""), `{}`...), err: ErrMalformed},
		{name: "empty input", data: nil, err: ErrMalformed},
		{name: "string", data: []byte(`"orders"`), err: ErrMalformed},
		{name: "empty object", data: []byte(`{}`), err: ErrMissingField},
		{name: "at size limit", data: padTo(t, payload(""), MaxPayloadSize), want: base},
		{name: "one byte over size limit", data: padTo(t, payload(""), MaxPayloadSize+1), err: ErrTooLarge},
		{name: "huge garbage", data: []byte(strings.Repeat("[", 1<<20)), err: ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode(tt.data)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Decode error = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !got.Equal(tt.want) {
				t.Fatalf("Decode = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// padTo grows a payload object to exactly size bytes with an unknown field.
func padTo(t testing.TB, data []byte, size int) []byte {
	t.Helper()
	const field = `,"pad":""}`
	n := size - len(data) - len(field) + 1 // +1: the '}' replaced
	if n < 0 {
		t.Fatalf("payload of %d bytes cannot be padded to %d", len(data), size)
	}
	out := append(data[:len(data)-1:len(data)-1], `,"pad":"`...)
	out = append(out, strings.Repeat("x", n)...)
	out = append(out, `"}`...)
	if len(out) != size {
		t.Fatalf("padded to %d bytes, want %d", len(out), size)
	}
	return out
}

func TestEncodeRoundTrip(t *testing.T) {
	paris := time.FixedZone("CET", 3600)
	tests := []Event{
		{Kind: Online, Service: "orders", InstanceID: "10.0.0.5:orders:8080", Incarnation: time.Now().UnixNano(), At: time.Now()},
		{Kind: Offline, Service: "orders", InstanceID: "10.0.0.5:orders:8080", Incarnation: 1, At: time.Date(2024, 11, 29, 14, 0, 0, 1, paris), Reason: "shutdown"},
		{Service: "a", InstanceID: "pod/billing 7.eu-west:9000", Incarnation: 1 << 62, At: time.Unix(0, 1)},
		{Kind: Offline, Service: "A_b-9", InstanceID: `quote" back\slash <tag> & ☃`, Incarnation: 3, At: time.Unix(1, 0), Reason: "tab\there\nnewline"},
		{Kind: Online, Service: strings.Repeat("s", MaxServiceLength), InstanceID: strings.Repeat("<", MaxInstanceIDLength), Incarnation: 9, At: time.Unix(5, 0)},
		// The worst case for size: every string at its limit, each byte escaped.
		{Kind: Offline, Service: strings.Repeat("s", MaxServiceLength), InstanceID: strings.Repeat("\u2028", MaxInstanceIDLength/3),
			Incarnation: 1<<63 - 1, At: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), Reason: strings.Repeat("\x01", MaxReasonLength),
			Region: strings.Repeat("\x01", MaxRegionLength)},
		{Kind: Online, Service: "orders", InstanceID: "orders-1", Incarnation: 2, At: time.Unix(7, 0), Region: "eu-west"},
	}
	for _, e := range tests {
		data, err := Encode(e)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", e, err)
		}
		if len(data) > MaxPayloadSize {
			t.Errorf("Encode wrote %d bytes, above MaxPayloadSize", len(data))
		}
		if !strings.HasPrefix(string(data), `{"v":1,`) {
			t.Errorf("payload %s does not start with the version", data)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatalf("Decode(%s): %v", data, err)
		}
		if !got.Equal(e) {
			t.Errorf("round trip of %+v gave %+v (payload %s)", e, got, data)
		}
	}
}

func TestEncodeWire(t *testing.T) {
	e := Event{Kind: Offline, Service: "orders", InstanceID: "10.0.0.5:orders:8080", Incarnation: 1732886400000000000,
		At: time.Date(2024, 11, 29, 15, 5, 7, 0, time.FixedZone("", 3600)), Reason: "shutdown"}
	data, err := Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	// Without a region, no "region" key: the payload of an announcer that
	// predates regions.
	const want = `{"v":1,"kind":"offline","service":"orders","instanceId":"10.0.0.5:orders:8080","incarnation":1732886400000000000,"at":"2024-11-29T14:05:07Z","reason":"shutdown"}`
	if string(data) != want {
		t.Errorf("Encode =\n%s\nwant\n%s", data, want)
	}
	e.Region = "eu-west"
	if data, err = Encode(e); err != nil {
		t.Fatal(err)
	}
	const wantRegion = `{"v":1,"kind":"offline","service":"orders","instanceId":"10.0.0.5:orders:8080","incarnation":1732886400000000000,"at":"2024-11-29T14:05:07Z","reason":"shutdown","region":"eu-west"}`
	if string(data) != wantRegion {
		t.Errorf("Encode =\n%s\nwant\n%s", data, wantRegion)
	}
}

func TestValidate(t *testing.T) {
	good := Event{Kind: Online, Service: "orders", InstanceID: "i-1", Incarnation: 1, At: time.Unix(1, 0)}
	tests := []struct {
		name   string
		change func(*Event)
		err    error
		field  string
	}{
		{"valid", func(*Event) {}, nil, ""},
		{"kind zero", func(e *Event) { e.Kind = 0 }, nil, ""},
		{"kind unknown", func(e *Event) { e.Kind = 9 }, ErrInvalidField, "kind"},
		{"no service", func(e *Event) { e.Service = "" }, ErrMissingField, "service"},
		{"service dot", func(e *Event) { e.Service = "a.b" }, ErrInvalidService, "service"},
		{"service gt", func(e *Event) { e.Service = ">" }, ErrInvalidService, "service"},
		{"no id", func(e *Event) { e.InstanceID = "" }, ErrMissingField, "instanceId"},
		{"id bad UTF-8", func(e *Event) { e.InstanceID = "a\xc3" }, ErrInvalidInstanceID, "instanceId"},
		{"id tab", func(e *Event) { e.InstanceID = "a\tb" }, ErrInvalidInstanceID, "instanceId"},
		{"id U+FFFD is fine", func(e *Event) { e.InstanceID = "a\uFFFDb" }, nil, ""},
		{"incarnation zero", func(e *Event) { e.Incarnation = 0 }, ErrInvalidField, "incarnation"},
		{"incarnation negative", func(e *Event) { e.Incarnation = -1 }, ErrInvalidField, "incarnation"},
		{"no at", func(e *Event) { e.At = time.Time{} }, ErrMissingField, "at"},
		{"at year 10000", func(e *Event) { e.At = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, ErrInvalidField, "at"},
		{"at year 1 that is year 0 in UTC", func(e *Event) { e.At = time.Date(1, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600)) }, ErrInvalidField, "at"},
		{"reason on online", func(e *Event) { e.Reason = "x" }, ErrInvalidField, "reason"},
		{"reason on offline", func(e *Event) { e.Kind, e.Reason = Offline, "x" }, nil, ""},
		{"reason too long", func(e *Event) { e.Kind, e.Reason = Offline, strings.Repeat("x", MaxReasonLength+1) }, ErrInvalidField, "reason"},
		{"reason bad UTF-8", func(e *Event) { e.Kind, e.Reason = Offline, "\xff" }, ErrInvalidField, "reason"},
		{"region", func(e *Event) { e.Region = "eu-west" }, nil, ""},
		{"region at limit", func(e *Event) { e.Region = strings.Repeat("r", MaxRegionLength) }, nil, ""},
		{"region too long", func(e *Event) { e.Region = strings.Repeat("r", MaxRegionLength+1) }, ErrInvalidField, "region"},
		{"region bad UTF-8", func(e *Event) { e.Region = "eu\xff" }, ErrInvalidField, "region"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := good
			tt.change(&e)
			err := e.Validate()
			if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
				t.Fatalf("Validate = %v, want %v", err, tt.err)
			}
			if err != nil && !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name %q", err, tt.field)
			}
			if _, encErr := Encode(e); !errors.Is(encErr, tt.err) || (tt.err == nil) != (encErr == nil) {
				t.Errorf("Encode error = %v, want %v", encErr, tt.err)
			}
		})
	}
}

func TestEncodeDecodeMessage(t *testing.T) {
	e := Event{Kind: Offline, Service: "orders", InstanceID: "10.0.0.5:orders:8080", Incarnation: 5, At: time.Unix(100, 0), Reason: "shutdown"}
	subject, data, err := EncodeMessage("prod.lb", e)
	if err != nil {
		t.Fatal(err)
	}
	if subject != "prod.lb.svc.orders.offline" {
		t.Errorf("subject = %q", subject)
	}
	got, err := DecodeMessage("prod.lb", subject, data)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(e) {
		t.Errorf("DecodeMessage = %+v, want %+v", got, e)
	}

	if _, _, err := EncodeMessage("lb", Event{Service: "orders", InstanceID: "i", Incarnation: 1, At: time.Unix(1, 0)}); !errors.Is(err, ErrInvalidField) {
		t.Errorf("EncodeMessage without kind: %v, want ErrInvalidField", err)
	}
	if _, _, err := EncodeMessage("lb.", e); !errors.Is(err, ErrInvalidPrefix) {
		t.Errorf("EncodeMessage with bad prefix: %v, want ErrInvalidPrefix", err)
	}
	if _, _, err := EncodeMessage("lb", Event{Kind: Online}); !errors.Is(err, ErrMissingField) {
		t.Errorf("EncodeMessage of an empty event: %v, want ErrMissingField", err)
	}
}

func TestDecodeMessage(t *testing.T) {
	const noKind = `{"service":"orders","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`
	const online = `{"kind":"online","service":"orders","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z"}`
	const withReason = `{"service":"orders","instanceId":"i-1","incarnation":7,"at":"2024-11-29T13:20:00Z","reason":"bye"}`
	tests := []struct {
		name, subject, data string
		kind                Kind
		err                 error
	}{
		{"kind from subject online", "lb.svc.orders.online", noKind, Online, nil},
		{"kind from subject offline", "lb.svc.orders.offline", noKind, Offline, nil},
		{"kinds agree", "lb.svc.orders.online", online, Online, nil},
		{"kinds disagree", "lb.svc.orders.offline", online, 0, ErrMismatch},
		{"services disagree", "lb.svc.billing.online", noKind, 0, ErrMismatch},
		{"service differs in case", "lb.svc.Orders.online", noKind, 0, ErrMismatch},
		{"reason on online subject", "lb.svc.orders.online", withReason, 0, ErrInvalidField},
		{"reason on offline subject", "lb.svc.orders.offline", withReason, Offline, nil},
		{"bad subject", "lb.svc.orders", noKind, 0, ErrBadSubject},
		{"other prefix", "x.svc.orders.online", noKind, 0, ErrBadSubject},
		{"bad payload", "lb.svc.orders.online", `{`, 0, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := DecodeMessage("lb", tt.subject, []byte(tt.data))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("DecodeMessage error = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeMessage: %v", err)
			}
			if e.Kind != tt.kind {
				t.Errorf("Kind = %v, want %v", e.Kind, tt.kind)
			}
		})
	}
}

func TestKind(t *testing.T) {
	for _, k := range []Kind{Online, Offline} {
		got, err := ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	if s := Kind(0).String(); s != "Kind(0)" {
		t.Errorf("Kind(0).String() = %q", s)
	}
	if _, err := ParseKind("Online"); !errors.Is(err, ErrInvalidField) {
		t.Errorf("ParseKind(Online) error = %v", err)
	}
}

func TestValidateService(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"orders", true}, {"Billing-API_v2", true}, {"0", true}, {strings.Repeat("a", MaxServiceLength), true},
		{"", false}, {strings.Repeat("a", MaxServiceLength+1), false}, {"a.b", false}, {"a*", false},
		{">", false}, {"a b", false}, {"a\tb", false}, {"é", false}, {"a/b", false}, {"a:b", false},
	}
	for _, tt := range tests {
		err := ValidateService(tt.in)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidService)) {
			t.Errorf("ValidateService(%q) = %v, want ok=%v", tt.in, err, tt.ok)
		}
	}
}

func TestValidateInstanceID(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"10.0.0.5:orders:8080", true}, {"pod/orders-7 blue", true}, {"*>", true}, {"☃", true},
		{strings.Repeat("i", MaxInstanceIDLength), true}, {" ", true},
		{"", false}, {strings.Repeat("i", MaxInstanceIDLength+1), false}, {"a\x00", false},
		{"a\r\n", false}, {"\xc3\x28", false}, {"\u009f", false},
	}
	for _, tt := range tests {
		err := ValidateInstanceID(tt.in)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidInstanceID)) {
			t.Errorf("ValidateInstanceID(%q) = %v, want ok=%v", tt.in, err, tt.ok)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	data := readTestdata(b, "good-online.json")
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	e := Event{Kind: Online, Service: "orders", InstanceID: "10.0.0.5:orders:8080", Incarnation: 1732886400000000000, At: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Encode(e); err != nil {
			b.Fatal(err)
		}
	}
}

func TestCheckIncarnation(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		inc int64
		ok  bool
	}{
		{1, true},                                       // a counter
		{now.UnixMilli() * 1_000_000, true},             // milliseconds x 10^6
		{now.UnixNano(), true},                          // the start time
		{now.Add(MaxIncarnationAhead).UnixNano(), true}, // clock skew, at the bound
		{now.Add(MaxIncarnationAhead).UnixNano() + 1, false},
		{math.MaxInt64, false},
	} {
		err := CheckIncarnation(tc.inc, now)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrFutureIncarnation)) {
			t.Errorf("CheckIncarnation(%d) = %v, want ok %v", tc.inc, err, tc.ok)
		}
	}
}
