package gateway

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/dns"
)

// The dns section of the YAML reaches the responder's Config; its
// mistakes are reported at their lines, naming the field.
func TestDNSConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("dns:\n  listen: 127.0.0.1:8600\n  ttl: 1s\n  zone: b\n  maxAnswers: 5\n"), 0o600)
	cfg, err := LoadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DNS.Addr != "127.0.0.1:8600" || cfg.DNS.TTL != time.Second || cfg.DNS.Zone != "b" || cfg.DNS.MaxAnswers != 5 {
		t.Errorf("dns section read as %+v", cfg.DNS)
	}

	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("dns:\n  listen: 127.0.0.1:8600\n  ttl: 1500ms\n"), 0o600)
	_, err = LoadFile(bad)
	if !errors.Is(err, ErrConfig) || !errors.Is(err, dns.ErrInvalidConfig) || !strings.Contains(err.Error(), "bad.yaml:1: dns: TTL: 1.5s: DNS counts whole seconds") {
		t.Errorf("bad ttl: %v", err)
	}

	off := DefaultConfig()
	off.DNS.TTL = 1500 * time.Millisecond // not checked while the responder is off
	if err := off.Validate(); err != nil {
		t.Errorf("an unused dns section: %v", err)
	}
}

// docs/dns.md's YAML is the gateway's: it loads, and its values are the
// defaults but for the address.
func TestDNSDocConfig(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "dns.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/dns.md has no YAML block")
	}
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	os.WriteFile(path, []byte(block), 0o600)
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := dns.DefaultConfig()
	want.Addr = "127.0.0.1:8600"
	if cfg.DNS != want {
		t.Errorf("docs/dns.md's YAML gives %+v, want the defaults %+v", cfg.DNS, want)
	}
}
