// Package gossipflag holds the gossip settings both binaries share: their
// command-line flags (and YAML keys) and the conversion to gossip.Config.
package gossipflag

import (
	"encoding/base64"
	"flag"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/commalist"
)

// Settings are the gossip settings. Gossip is off unless Bind or Join is set.
type Settings struct {
	// Join is a comma-separated list of peers, host:port.
	Join string `yaml:"join"`
	// Bind is the memberlist bind address, host:port.
	Bind string `yaml:"bind"`
	// Profile is "lan" (default) or "fast".
	Profile string `yaml:"profile"`
	// Key is the base64 encoding of a 16, 24 or 32-byte AES key.
	Key string `yaml:"key"`
	// Label keeps clusters that share a network apart.
	Label string `yaml:"label"`
}

// Register adds -gossip, -gossip-bind, -gossip-profile, -gossip-key and
// -gossip-label to fs.
func (s *Settings) Register(fs *flag.FlagSet) {
	fs.StringVar(&s.Join, "gossip", s.Join, "gossip (memberlist) peers `host:port[,...]` to join; gossip is off unless this or -gossip-bind is set")
	fs.StringVar(&s.Bind, "gossip-bind", s.Bind, "gossip bind `host:port` (default 0.0.0.0:7946 when gossip is on; port 0 picks one)")
	fs.StringVar(&s.Profile, "gossip-profile", s.Profile, "gossip timings: lan (memberlist's LAN defaults, crash noticed in ~6-10 s) or fast (~1-1.5 s)")
	fs.StringVar(&s.Key, "gossip-key", s.Key, "gossip encryption `key`, base64 of 16, 24 or 32 bytes")
	fs.StringVar(&s.Label, "gossip-label", s.Label, "gossip `label`; nodes with different labels ignore each other")
}

// Enabled reports whether gossip is on.
func (s Settings) Enabled() bool { return s.Bind != "" || s.Join != "" }

// Config builds the gossip configuration of a node with meta.
func (s Settings) Config(meta gossip.Meta, log zerolog.Logger) (gossip.Config, error) {
	cfg := gossip.Config{BindAddr: s.Bind, Profile: gossip.Profile(s.Profile), Label: s.Label, Meta: meta, Logger: log}
	cfg.Join = commalist.Split(s.Join)
	if s.Key != "" {
		key, err := base64.StdEncoding.DecodeString(s.Key)
		if err != nil {
			return cfg, fmt.Errorf("%w: gossip key: not base64: %w", gossip.ErrInvalidConfig, err)
		}
		cfg.SecretKey = key
	}
	return cfg, cfg.Validate()
}
