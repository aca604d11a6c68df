package balancer

import (
	"errors"
	"fmt"
	"slices"
)

// ClientsConfig is the configuration of every client (service) a gateway
// balances over: global defaults and per-client settings. It is what
// [NewFactory] takes, and what the loaders of package
// github.com/pushlb/pushlb/balancer/lbconfig return (LoadYAML,
// LoadProperties, LoadFile; Section holds it in a larger YAML file).
//
// In YAML it reads:
//
//	defaults:            # over DefaultConfig()
//	  rule: ZoneAvoidance
//	  zone: a
//	clients:
//	  orders:            # over defaults, field by field
//	    rule: RoundRobin
//	    listOfServers: ["127.0.0.1:9001", "127.0.0.1:9002"]
//	    breaker: {threshold: 5}
//
// The keys are the yaml tags of [Config]. A client's settings override the
// defaults field by field, nested settings included (breaker: {threshold: 5}
// keeps the default factor and max). Durations are written with a unit
// ("30s", "500ms"; a bare 0 is 0). A key left out or set to null keeps the inherited
// value; write "" or [] to clear one. A list may also be written as one
// comma-separated string, as Ribbon's listOfServers is. Anchors, aliases
// and merge keys (<<) work as in YAML. Unknown keys are errors. Rule and
// filter names may be written any way Config accepts (Ribbon's class names
// too); the loaded configuration holds pushlb's names (RuleRoundRobin, ...).
type ClientsConfig struct {
	// Defaults is the configuration of a client without an entry in
	// Clients, and the base every entry was merged over.
	Defaults Config `yaml:"defaults"`
	// Clients holds each named client's complete configuration: Defaults
	// with the client's own settings applied.
	Clients map[string]Config `yaml:"clients"`
	// IgnoredKeys lists the keys of a Ribbon .properties file that belong
	// to Ribbon but that pushlb does not use on purpose (server list and
	// updater classes, connection pools, ...), as written and in file
	// order, so the caller can log them. It is empty for YAML.
	IgnoredKeys []string `yaml:"-"`
}

// DefaultClientsConfig returns a configuration with DefaultConfig() as the
// defaults and no client of its own.
func DefaultClientsConfig() *ClientsConfig {
	return &ClientsConfig{Defaults: DefaultConfig(), Clients: make(map[string]Config)}
}

// For returns the configuration of the client name: its own entry, or the
// defaults for a client without one. The result is a copy the caller may
// change. On a nil receiver it returns DefaultConfig().
func (c *ClientsConfig) For(name string) Config {
	if c == nil {
		return DefaultConfig()
	}
	cfg, ok := c.Clients[name]
	if !ok {
		cfg = c.Defaults
	}
	return cloneConfig(cfg)
}

// Names returns the names of the clients with an entry of their own,
// sorted.
func (c *ClientsConfig) Names() []string {
	if c == nil {
		return nil
	}
	names := make([]string, 0, len(c.Clients))
	for name := range c.Clients {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Validate checks the defaults and every client's configuration. It reports
// an invalid default alone (every client inherits it), otherwise every
// invalid client, each error naming its client and wrapping
// ErrInvalidConfig.
func (c *ClientsConfig) Validate() error {
	if err := c.Defaults.Validate(); err != nil {
		return fmt.Errorf("defaults: %w", err)
	}
	var errs []error
	for _, name := range c.Names() {
		if name == "" {
			errs = append(errs, fmt.Errorf("%w: empty client name", ErrInvalidConfig))
			continue
		}
		cfg := c.Clients[name]
		if err := cfg.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("client %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Clone returns a deep copy: changing it leaves c alone.
func (c *ClientsConfig) Clone() *ClientsConfig {
	if c == nil {
		return nil
	}
	out := &ClientsConfig{
		Defaults:    cloneConfig(c.Defaults),
		Clients:     make(map[string]Config, len(c.Clients)),
		IgnoredKeys: slices.Clone(c.IgnoredKeys),
	}
	for name, cfg := range c.Clients {
		out.Clients[name] = cloneConfig(cfg)
	}
	return out
}

// cloneConfig copies the reference-typed fields of a Config, so that copies
// share nothing.
func cloneConfig(c Config) Config {
	c.ListOfServers = slices.Clone(c.ListOfServers)
	c.RegionPriority = slices.Clone(c.RegionPriority)
	return c
}
