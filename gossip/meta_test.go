package gossip

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDefaultNodeName(t *testing.T) {
	m := instanceMeta("orders", "host-1:orders:9001", 1732886400000000000)
	if got, want := DefaultNodeName(m), "orders/host-1:orders:9001/1732886400000000000"; got != want {
		t.Fatalf("DefaultNodeName = %q, want %q", got, want)
	}

	g1, g2 := DefaultNodeName(gatewayMeta()), DefaultNodeName(gatewayMeta())
	if !strings.HasPrefix(g1, "gateway-") || g1 == g2 {
		t.Fatalf("gateway names %q and %q: want distinct gateway-<host>-<random>", g1, g2)
	}

	long1 := instanceMeta("orders", strings.Repeat("é", 100)+"1", 1)
	long2 := instanceMeta("orders", strings.Repeat("é", 100)+"2", 1)
	n1, n2 := DefaultNodeName(long1), DefaultNodeName(long2)
	for _, n := range []string{n1, n2} {
		if len(n) > MaxNodeNameLength || !utf8.ValidString(n) || !strings.Contains(n, "~") {
			t.Fatalf("long name %q (%d bytes): want at most %d bytes, valid UTF-8, hashed", n, len(n), MaxNodeNameLength)
		}
	}
	if n1 == n2 {
		t.Fatalf("long names collide: %q", n1)
	}
	if DefaultNodeName(long1) != n1 {
		t.Fatal("long name not deterministic")
	}
}

func TestMetaEncoding(t *testing.T) {
	m := instanceMeta("orders", "10.0.0.1:orders:9001", 42)
	b, err := m.encode(false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"role":"instance","service":"orders","instanceId":"10.0.0.1:orders:9001","incarnation":42}`; got != want {
		t.Fatalf("encoding = %s, want %s", got, want)
	}
	got, leaving, err := decodeMeta(b)
	if err != nil || got != m || leaving {
		t.Fatalf("decode = %+v, %v, %v", got, leaving, err)
	}
	b, _ = m.encode(true)
	if _, leaving, err := decodeMeta(b); err != nil || !leaving {
		t.Fatalf("leaving flag lost: %s", b)
	}

	// The limit counts the leave flag, so a Meta accepted at Start can
	// always be flagged.
	for size := 400; size < 600; size++ {
		m := instanceMeta("orders", strings.Repeat("x", size), 1)
		err := m.Validate()
		flagged, _ := json.Marshal(wireMeta{Meta: m, Leaving: true})
		if fits := len(flagged) <= MaxMetaSize; fits != (err == nil) {
			t.Fatalf("id of %d bytes: Validate = %v, flagged encoding %d bytes", size, err, len(flagged))
		}
		if err != nil && !errors.Is(err, ErrMetaTooLarge) {
			t.Fatalf("Validate = %v, want ErrMetaTooLarge", err)
		}
	}

	for _, bad := range []string{``, `{`, `[]`, `{"role":"db"}`, `{"role":"instance","service":"s"}`, strings.Repeat(" ", 600)} {
		if _, _, err := decodeMeta([]byte(bad)); err == nil {
			t.Errorf("decodeMeta(%q) accepted", bad)
		}
	}
	// Unknown fields are ignored, so the format can grow.
	if got, _, err := decodeMeta([]byte(`{"role":"gateway","zone":"a"}`)); err != nil || got != gatewayMeta() {
		t.Fatalf("decode with unknown field = %+v, %v", got, err)
	}
}
