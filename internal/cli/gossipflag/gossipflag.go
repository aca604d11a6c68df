// Package gossipflag holds the gossip settings both binaries share: their
// command-line flags (and YAML keys) and the conversion to gossip.Config.
package gossipflag

import (
	"encoding/base64"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/base/commalist"
)

// Settings are the gossip settings. Gossip is on when Bind or Join is set
// (-gossip-bind, -gossip; YAML gossip.bind, gossip.join), off otherwise;
// Profile, Key and Label only tune it.
type Settings struct {
	// Join is a comma-separated list of peers, host:port.
	Join string `yaml:"join"`
	// Bind is the memberlist bind address, host:port. Empty: a free port
	// on the address that reaches the first peer for an instance that
	// joins (gossip.Config.BindAddr), 0.0.0.0:7946 for a gateway.
	Bind string `yaml:"bind"`
	// Profile is "lan" (default) or "fast".
	Profile string `yaml:"profile"`
	// Key is the base64 encoding of a 16, 24 or 32-byte AES key. KeyFile
	// names a file holding it instead, and the environment variable
	// PUSHLB_GOSSIP_KEY is used when neither is set, so that the key need
	// not be on a command line (ps shows those).
	Key     string `yaml:"key"`
	KeyFile string `yaml:"keyFile"`
	// Label keeps clusters that share a network apart.
	Label string `yaml:"label"`
}

// KeyEnv is the environment variable the gossip key is read from when
// neither -gossip-key nor -gossip-key-file is given.
const KeyEnv = "PUSHLB_GOSSIP_KEY"

// Register adds -gossip, -gossip-bind, -gossip-profile, -gossip-key,
// -gossip-key-file and -gossip-label to fs.
func (s *Settings) Register(fs *flag.FlagSet) {
	fs.StringVar(&s.Join, "gossip", s.Join, "gossip (memberlist) peers `host:port[,...]` to join (the gateways' -gossip-bind addresses); gossip is on when this or -gossip-bind is set, off otherwise")
	fs.StringVar(&s.Bind, "gossip-bind", s.Bind, "gossip bind `host:port`; setting it turns gossip on. Default when gossip is on: a gateway 0.0.0.0:7946, an instance (announce) a free port on the address it reaches its first -gossip peer from (127.0.0.1 for a gateway on loopback), recorded in its registry entry")
	fs.StringVar(&s.Profile, "gossip-profile", s.Profile, "gossip timings: lan (memberlist's LAN defaults, crash noticed in ~6-10 s) or fast (~0.6-0.8 s); the same on every node. Checked always, used only with gossip on")
	fs.StringVar(&s.Key, "gossip-key", s.Key, "gossip encryption and authentication `key`, base64 of 16, 24 or 32 random bytes (head -c32 /dev/urandom | base64), the same on every node; without it anything that reaches the gossip port can join. Checked always, used only with gossip on")
	fs.StringVar(&s.KeyFile, "gossip-key-file", s.KeyFile, "`file` holding the gossip key (instead of -gossip-key; "+KeyEnv+" is read when neither is given)")
	fs.StringVar(&s.Label, "gossip-label", s.Label, "gossip `label`; nodes with different labels ignore each other. Checked always, used only with gossip on")
}

// Enabled reports whether gossip is on: Bind or Join is set.
func (s Settings) Enabled() bool { return s.Bind != "" || s.Join != "" }

// Validate checks every setting, whether gossip is on or off, so that a
// mistake (an unknown profile, a key that is not base64 of 16, 24 or 32
// bytes) is reported before the day gossip is turned on. The error wraps
// gossip.ErrInvalidConfig.
func (s Settings) Validate() error {
	_, err := s.Config(gossip.Meta{Role: gossip.RoleGateway}, zerolog.Nop())
	return err
}

// Ignored returns the settings given while gossip is off, which then have
// no effect, each as "-flag (yaml.key)"; nil when gossip is on or none is
// given.
func (s Settings) Ignored() []string {
	if s.Enabled() {
		return nil
	}
	var out []string
	if s.Profile != "" {
		out = append(out, "-gossip-profile (gossip.profile)")
	}
	if s.Key != "" {
		out = append(out, "-gossip-key (gossip.key)")
	}
	if s.KeyFile != "" {
		out = append(out, "-gossip-key-file (gossip.keyFile)")
	}
	if s.Label != "" {
		out = append(out, "-gossip-label (gossip.label)")
	}
	return out
}

// WarnIgnored logs a warning when settings are given while gossip is off.
func (s Settings) WarnIgnored(log zerolog.Logger) {
	if ignored := s.Ignored(); len(ignored) > 0 {
		log.Warn().Strs("settings", ignored).
			Msg("gossip is off, so these gossip settings have no effect; gossip is on when -gossip (gossip.join) or -gossip-bind (gossip.bind) is set")
	}
}

// Config builds the gossip configuration of a node with meta. The error
// wraps gossip.ErrInvalidConfig.
func (s Settings) Config(meta gossip.Meta, log zerolog.Logger) (gossip.Config, error) {
	cfg := gossip.Config{BindAddr: s.Bind, Profile: gossip.Profile(s.Profile), Label: s.Label, Meta: meta, Logger: log}
	cfg.Join = commalist.Split(s.Join)
	encoded, err := s.key()
	if err != nil {
		return cfg, err
	}
	if encoded != "" {
		key, err := base64.StdEncoding.DecodeString(encoded)
		if err != nil {
			return cfg, fmt.Errorf("%w: gossip key: not base64: %w", gossip.ErrInvalidConfig, err)
		}
		cfg.SecretKey = key
	}
	return cfg, cfg.Validate()
}

// key returns the base64 key from Key, KeyFile or the environment; errors
// name where it came from, never the key.
func (s Settings) key() (string, error) {
	switch {
	case s.Key != "" && s.KeyFile != "":
		return "", fmt.Errorf("%w: -gossip-key and -gossip-key-file (gossip.key, gossip.keyFile) go alone", gossip.ErrInvalidConfig)
	case s.Key != "":
		return s.Key, nil
	case s.KeyFile != "":
		b, err := os.ReadFile(s.KeyFile)
		if err != nil {
			return "", fmt.Errorf("%w: gossip key file: %w", gossip.ErrInvalidConfig, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return strings.TrimSpace(os.Getenv(KeyEnv)), nil
}
