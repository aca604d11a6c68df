package gossipflag

import (
	"errors"
	"flag"
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
