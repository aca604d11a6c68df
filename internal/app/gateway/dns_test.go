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
