package serverlist_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// kvKey is what JetStream KV accepts as a key.
var kvKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func TestKeyRoundTrip(t *testing.T) {
	t.Parallel()
	ids := []string{
		"a",
		"10.0.0.1:orders:9001",
		"host.example.com:orders:443",
		"pod/orders-7d9f/0",
		"with spaces and\ttabs? no: tabs are control",
		"with spaces",
		"ünïcödé ✓ 日本語 🚀",
		"..",
		"=+/?#&%",
		strings.Repeat("x", events.MaxInstanceIDLength),
		strings.Repeat("é", events.MaxInstanceIDLength/2),
	}
	for _, id := range ids {
		key, err := serverlist.EncodeKey("orders", id)
		if strings.ContainsRune(id, '\t') {
			if !errors.Is(err, serverlist.ErrInvalidInstance) {
				t.Errorf("EncodeKey(%q) = %v, want ErrInvalidInstance", id, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("EncodeKey(%q): %v", id, err)
		}
		if !kvKey.MatchString(key) || strings.Count(key, ".") != 1 {
			t.Errorf("EncodeKey(%q) = %q: not a single-dot KV key", id, key)
		}
		service, got, err := serverlist.DecodeKey(key)
		if err != nil {
			t.Fatalf("DecodeKey(%q): %v", key, err)
		}
		if service != "orders" || got != id {
			t.Errorf("DecodeKey(EncodeKey(%q)) = %q, %q", id, service, got)
		}
	}
}

func TestKeyExample(t *testing.T) {
	t.Parallel()
	key, err := serverlist.EncodeKey("orders", "10.0.0.1:orders:9001")
	if err != nil {
		t.Fatal(err)
	}
	if want := "orders.MTAuMC4wLjE6b3JkZXJzOjkwMDE"; key != want {
		t.Fatalf("EncodeKey = %q, want %q", key, want)
	}
	key, err = serverlist.EncodeRegionalKey("orders", "eu", "a")
	if err != nil || key != "orders.YQ=eu" {
		t.Fatalf("EncodeRegionalKey = %q, %v, want orders.YQ=eu", key, err)
	}
	if service, id, err := serverlist.DecodeKey(key); err != nil || service != "orders" || id != "a@eu" {
		t.Fatalf("DecodeKey(%q) = %q, %q, %v", key, service, id, err)
	}
	// An ID of the greatest length has no room for its region.
	long := strings.Repeat("0", events.MaxInstanceIDLength)
	if _, err := serverlist.EncodeRegionalKey("orders", "eu", long); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("EncodeRegionalKey of a %d-byte ID: %v, want ErrInvalidInstance", len(long), err)
	}
}

func TestDecodeKeyRejects(t *testing.T) {
	t.Parallel()
	for _, key := range []string{
		"",
		"orders",
		"orders.",
		".YQ",
		"or*ders.YQ",
		"orders.YQ.YQ",
		"orders.YQ==", // padded
		"orders.YR",   // non-canonical trailing bits
		"orders.Y",    // impossible length
		"orders.YQ\n",
		"orders.AA",     // NUL byte ID
		"orders.gA",     // invalid UTF-8
		"orders.a+b/",   // standard, not URL alphabet
		"orders.YQ\r\n", // decoder would skip these
		"orders.YQ=",    // a regional key without its region
		"orders.=eu",    // nor its ID
		"orders.YQ=e u", // a region outside [A-Za-z0-9_-]
		"orders.YQ=eu=x",
		"orders.YR=eu", // non-canonical, regional
	} {
		if _, _, err := serverlist.DecodeKey(key); !errors.Is(err, serverlist.ErrInvalidKey) {
			t.Errorf("DecodeKey(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
}

func FuzzKeyRoundTrip(f *testing.F) {
	f.Add("orders", "10.0.0.1:orders:9001", "orders.YQ")
	f.Add("a", "ü/ .:", "a.w7w")
	f.Add("S_-9", "\x00", "x.YR")
	f.Fuzz(func(t *testing.T, service, id, key string) {
		// Whatever EncodeKey accepts decodes back to itself.
		if k, err := serverlist.EncodeKey(service, id); err == nil {
			if !kvKey.MatchString(k) {
				t.Fatalf("EncodeKey(%q, %q) = %q: not a KV key", service, id, k)
			}
			s, i, err := serverlist.DecodeKey(k)
			if err != nil || s != service || i != id {
				t.Fatalf("DecodeKey(EncodeKey(%q, %q)) = %q, %q, %v", service, id, s, i, err)
			}
		} else if !errors.Is(err, serverlist.ErrInvalidInstance) {
			t.Fatalf("EncodeKey error %v does not wrap ErrInvalidInstance", err)
		}
		// A copy of region eu's record decodes to its qualified ID.
		if k, err := serverlist.EncodeRegionalKey(service, "eu", id); err == nil {
			s, i, err := serverlist.DecodeKey(k)
			if !kvKey.MatchString(k) || !serverlist.IsRegionalKey(k) || err != nil || s != service || i != serverlist.QualifiedID(id, "eu") {
				t.Fatalf("DecodeKey(EncodeRegionalKey(%q, eu, %q)) = %q, %q, %v", service, id, s, i, err)
			}
		}
		// Whatever DecodeKey accepts is canonical: it encodes back to the key.
		if s, i, err := serverlist.DecodeKey(key); err == nil {
			k, err := serverlist.EncodeKey(s, i)
			if serverlist.IsRegionalKey(key) {
				at := strings.LastIndex(i, "@")
				k, err = serverlist.EncodeRegionalKey(s, i[at+1:], i[:at])
			}
			if err != nil || k != key {
				t.Fatalf("EncodeKey(DecodeKey(%q)) = %q, %v", key, k, err)
			}
		} else if !errors.Is(err, serverlist.ErrInvalidKey) {
			t.Fatalf("DecodeKey error %v does not wrap ErrInvalidKey", err)
		}
	})
}
