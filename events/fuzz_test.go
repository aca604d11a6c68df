package events

import (
	"os"
	"path/filepath"
	"testing"
	"time"
	"unicode"

	"pgregory.net/rapid"
)

// FuzzDecode checks that Decode never panics and that whatever it accepts
// survives a round trip: Encode succeeds and decoding its output gives the
// same event.
func FuzzDecode(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"v":1,"kind":"offline","service":"s","instanceId":"a\u2028b\\\"","incarnation":1,"at":"2024-02-29T23:59:59.999999999-23:59","reason":"\u0000"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := Decode(data)
		if err != nil {
			return
		}
		enc, err := Encode(e)
		if err != nil {
			t.Fatalf("Decode accepted %q as %+v, but Encode fails: %v", data, e, err)
		}
		if len(enc) > MaxPayloadSize {
			t.Fatalf("Encode wrote %d bytes", len(enc))
		}
		got, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)) = %v (payload %q)", e, err, enc)
		}
		if !got.Equal(e) {
			t.Fatalf("round trip changed %+v into %+v", e, got)
		}
		// Encode writes UTC; the instant must not move.
		if got.At.Location() != time.UTC {
			t.Fatalf("re-decoded time is in %v, want UTC", got.At.Location())
		}
	})
}

// TestRoundTripProperty generates valid events of every shape, including
// IDs, reasons and regions at their byte limits, and checks Encode and Decode agree.
func TestRoundTripProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		idRune := rapid.Rune().Filter(func(r rune) bool { return !unicode.IsControl(r) })
		e := Event{
			Kind:        Kind(rapid.IntRange(0, 2).Draw(t, "kind")),
			Service:     rapid.StringMatching(`[A-Za-z0-9_-]{1,128}`).Draw(t, "service"),
			InstanceID:  rapid.StringOfN(idRune, 1, -1, MaxInstanceIDLength).Draw(t, "instanceId"),
			Incarnation: rapid.Int64Min(1).Draw(t, "incarnation"),
			At: time.Unix(0, rapid.Int64().Draw(t, "at")).
				In(time.FixedZone("", 60*rapid.IntRange(-23*60-59, 23*60+59).Draw(t, "offset"))),
		}
		if e.Kind != Online {
			e.Reason = rapid.StringOfN(rapid.Rune(), 0, -1, MaxReasonLength).Draw(t, "reason")
		}
		e.Region = rapid.StringOfN(rapid.Rune(), 0, -1, MaxRegionLength).Draw(t, "region")
		data, err := Encode(e)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", e, err)
		}
		if len(data) > MaxPayloadSize {
			t.Fatalf("Encode wrote %d bytes", len(data))
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatalf("Decode(%s): %v", data, err)
		}
		if !got.Equal(e) {
			t.Fatalf("round trip changed %+v into %+v", e, got)
		}
	})
}
