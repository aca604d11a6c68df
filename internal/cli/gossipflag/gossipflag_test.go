package gossipflag

import (
	"errors"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/gossip"
)

func TestSettings(t *testing.T) {
	var s Settings
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	s.Register(fs)
	if s.Enabled() {
		t.Fatal("gossip must be off by default")
	}
	err := fs.Parse([]string{"-gossip", "127.0.0.1:7946, 127.0.0.1:7947", "-gossip-profile", "fast", "-gossip-key", "MDEyMzQ1Njc4OWFiY2RlZg==", "-gossip-label", "prod"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := s.Config(gossip.Meta{Role: gossip.RoleGateway}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if !s.Enabled() || len(cfg.Join) != 2 || cfg.Join[1] != "127.0.0.1:7947" || len(cfg.SecretKey) != 16 || cfg.Profile != gossip.ProfileFast || cfg.Label != "prod" {
		t.Fatalf("config %+v", cfg)
	}
	for _, bad := range []Settings{{Join: "x:1", Key: "not base64!"}, {Join: "x:1", Key: "c2hvcnQ="}, {Join: "x:1", Profile: "warp"}} {
		if _, err := bad.Config(gossip.Meta{Role: gossip.RoleGateway}, zerolog.Nop()); !errors.Is(err, gossip.ErrInvalidConfig) {
			t.Errorf("%+v: want ErrInvalidConfig, got %v", bad, err)
		}
	}
}

// TestValidatedAndWarnedWhenOff: the settings are checked with gossip off
// too, and the ones given then are named in a warning.
func TestValidatedAndWarnedWhenOff(t *testing.T) {
	for _, bad := range []Settings{{Profile: "warp"}, {Key: "not base64!"}, {Key: "c2hvcnQ="}} {
		if err := bad.Validate(); !errors.Is(err, gossip.ErrInvalidConfig) {
			t.Errorf("%+v with gossip off: Validate = %v, want ErrInvalidConfig", bad, err)
		}
	}
	off := Settings{Profile: "fast", Key: "MDEyMzQ1Njc4OWFiY2RlZg==", Label: "prod"}
	if err := off.Validate(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	off.WarnIgnored(zerolog.New(&out))
	for _, want := range []string{`"level":"warn"`, "-gossip-profile (gossip.profile)", "-gossip-key (gossip.key)", "-gossip-label (gossip.label)", "-gossip-bind"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("warning %s lacks %q", out.String(), want)
		}
	}
	for _, quiet := range []Settings{{}, {Join: "127.0.0.1:7946", Profile: "fast"}, {Bind: "127.0.0.1:0", Key: "MDEyMzQ1Njc4OWFiY2RlZg=="}} {
		out.Reset()
		quiet.WarnIgnored(zerolog.New(&out))
		if out.Len() != 0 {
			t.Errorf("%+v: unexpected warning %s", quiet, out.String())
		}
	}
}

// The key may come from a file or the environment, off the command line.
func TestKeyFromFileOrEnvironment(t *testing.T) {
	const key = "MDEyMzQ1Njc4OWFiY2RlZg==" // 16 bytes
	file := t.TempDir() + "/gossip.key"
	if err := os.WriteFile(file, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	meta := gossip.Meta{Role: gossip.RoleGateway}
	cfg, err := Settings{Join: "x:1", KeyFile: file}.Config(meta, zerolog.Nop())
	if err != nil || len(cfg.SecretKey) != 16 {
		t.Fatalf("key file: %v, %d bytes", err, len(cfg.SecretKey))
	}
	t.Setenv(KeyEnv, key)
	if cfg, err = (Settings{Join: "x:1"}).Config(meta, zerolog.Nop()); err != nil || len(cfg.SecretKey) != 16 {
		t.Fatalf("environment: %v, %d bytes", err, len(cfg.SecretKey))
	}
	for name, s := range map[string]Settings{
		"both":         {Join: "x:1", Key: key, KeyFile: file},
		"missing file": {Join: "x:1", KeyFile: file + ".none"},
	} {
		_, err := s.Config(meta, zerolog.Nop())
		if !errors.Is(err, gossip.ErrInvalidConfig) || strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
