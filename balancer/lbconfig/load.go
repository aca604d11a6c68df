package lbconfig

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/base/yamlx"
)

// LoadYAML reads a YAML configuration (see [balancer.ClientsConfig] for
// the format). An empty document gives balancer.DefaultClientsConfig().
// Every resulting Config is validated. Errors wrap
// balancer.ErrInvalidConfig, except errors reading r; each problem names
// its line and its key path ("clients.orders.breaker.threshold"), and
// every problem of every client is reported, in line order.
func LoadYAML(r io.Reader) (*balancer.ClientsConfig, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("lbconfig: reading YAML: %w", err)
	}
	cfg, err := loadYAML("", data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", balancer.ErrInvalidConfig, err)
	}
	return cfg, nil
}

// LoadFile reads the configuration file at path: YAML for a .yaml or .yml
// extension, Ribbon properties for .properties. Errors name the path; a
// missing file's wraps fs.ErrNotExist.
func LoadFile(path string) (*balancer.ClientsConfig, error) {
	kind := strings.ToLower(filepath.Ext(path))
	if kind != ".yaml" && kind != ".yml" && kind != ".properties" {
		return nil, fmt.Errorf("%w: %s: unknown kind of file (want .yaml, .yml or .properties)", balancer.ErrInvalidConfig, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("lbconfig: %w", err)
	}
	if kind == ".properties" {
		cfg, err := loadProperties(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := loadYAML(path, data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", balancer.ErrInvalidConfig, err)
	}
	return cfg, nil
}

// Section is the balancer section of a larger YAML configuration: a
// field of type Section decodes with the same rules as LoadYAML, from
// yaml.v3 or from the gateway's strict decoder (internal/yamlx), which
// then names the file and the whole key path
// ("balancer.clients.orders.rule") in errors.
//
//	type GatewayConfig struct {
//		Listen   string          `yaml:"listen"`
//		Balancer lbconfig.Section `yaml:"balancer"`
//	}
//
// A section left out or null leaves ClientsConfig nil. Errors wrap
// balancer.ErrInvalidConfig.
type Section struct {
	*balancer.ClientsConfig
}

// UnmarshalYAML implements yaml.Unmarshaler. Decoding starts from
// DefaultClientsConfig(), not from the section's current content.
func (s *Section) UnmarshalYAML(n *yaml.Node) error {
	cfg, err := decodeClients(n)
	if err != nil {
		return err
	}
	s.ClientsConfig = cfg
	return nil
}

// MarshalYAML implements yaml.Marshaler: a section marshals as its
// ClientsConfig.
func (s Section) MarshalYAML() (any, error) { return s.ClientsConfig, nil }

func loadYAML(file string, data []byte) (*balancer.ClientsConfig, error) {
	doc, err := yamlx.Parse(data)
	if err == nil {
		var cfg *balancer.ClientsConfig
		if cfg, err = decodeClients(doc); err == nil {
			return cfg, nil
		}
	}
	for _, e := range yamlx.Errors(err) {
		e.File = file
	}
	return nil, err
}

// document is the top level of the YAML configuration. The parts are
// decoded one at a time, each over the one it inherits from.
type document struct {
	Defaults yaml.Node `yaml:"defaults"`
	Clients  yaml.Node `yaml:"clients"`
}

// decodeClients decodes n, a document or mapping with the keys "defaults"
// and "clients". Its errors are *yamlx.Error values wrapping
// balancer.ErrInvalidConfig, joined.
func decodeClients(n *yaml.Node) (*balancer.ClientsConfig, error) {
	out := balancer.DefaultClientsConfig()
	if n == nil {
		return out, nil
	}
	var doc document
	if err := yamlx.DecodeNode(n, &doc); err != nil {
		return nil, invalid(err)
	}
	// Every mistake is reported in one pass: the clients' too when the
	// defaults have one. They are then decoded over the built-in
	// defaults, so that a value of the file's defaults out of range is
	// reported once, not once more for every client inheriting it.
	var errs []error
	if err := decodeConfig(&doc.Defaults, &out.Defaults, "defaults", nil); err != nil {
		errs = append(errs, err)
		out.Defaults = balancer.DefaultConfig()
	}
	clients := resolve(&doc.Clients)
	if clients.Kind == 0 || isNull(clients) {
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		return out, nil
	}
	if clients.Kind != yaml.MappingNode {
		errs = append(errs, invalid(&yamlx.Error{Line: clients.Line, Path: "clients",
			Msg: "want a mapping of client names to settings, not " + yamlx.Describe(clients)}))
		return nil, errors.Join(errs...)
	}
	seen := make(map[string]int)
	for i := 0; i+1 < len(clients.Content); i += 2 {
		k, v := clients.Content[i], clients.Content[i+1]
		name := k.Value
		path := "clients." + name
		if k.Kind != yaml.ScalarNode || name == "" {
			errs = append(errs, invalid(&yamlx.Error{Line: k.Line, Path: "clients", Msg: "a client name must be a non-empty string"}))
			continue
		}
		if line, dup := seen[name]; dup {
			errs = append(errs, invalid(&yamlx.Error{Line: k.Line, Path: path, Msg: fmt.Sprintf("client repeated (first at line %d)", line)}))
			continue
		}
		seen[name] = k.Line
		cfg := out.Defaults
		cfg.ListOfServers, cfg.RegionPriority = slices.Clone(cfg.ListOfServers), slices.Clone(cfg.RegionPriority)
		if err := decodeConfig(v, &cfg, path, k); err != nil {
			errs = append(errs, err)
			continue
		}
		out.Clients[name] = cfg
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// decodeConfig decodes n over cfg and validates the result, also when
// decoding found errors (a typo does not hide a value out of range). at is
// the key naming the client, for errors about inherited values.
func decodeConfig(n *yaml.Node, cfg *balancer.Config, path string, at *yaml.Node) error {
	decodeErr := invalid(yamlx.DecodeNode(n, cfg, yamlx.CommaLists(), yamlx.AtPath(path)))
	canonicalNames(cfg)
	if len(cfg.ListOfServers) == 0 {
		cfg.ListOfServers = nil // [] and null both mean none; keep one form
	}
	if len(cfg.RegionPriority) == 0 {
		cfg.RegionPriority = nil
	}
	e := validationError(n, cfg, path, at)
	if e == nil || slices.ContainsFunc(yamlx.Errors(decodeErr), func(d *yamlx.Error) bool { return d.Path == e.Path }) {
		return decodeErr
	}
	if decodeErr == nil {
		return e
	}
	return errors.Join(decodeErr, e)
}

// validationError validates cfg, decoded from n, and places its error at
// the key it names, nil when it is valid.
func validationError(n *yaml.Node, cfg *balancer.Config, path string, at *yaml.Node) *yamlx.Error {
	err := cfg.Validate()
	if err == nil {
		return nil
	}
	e := &yamlx.Error{Path: path, Msg: strings.TrimPrefix(err.Error(), balancer.ErrInvalidConfig.Error()+": "), Err: err}
	if at != nil {
		e.Line = at.Line
	}
	var fe *balancer.FieldError
	if errors.As(err, &fe) {
		e.Path = path + "." + fe.Field
		if key := find(n, fe.Field); key != nil {
			e.Line = key.Line
		} else if e.Line == 0 {
			e.Line = n.Line
		}
	}
	return e
}

// invalid makes every *yamlx.Error in err wrap balancer.ErrInvalidConfig.
func invalid(err error) error {
	for _, e := range yamlx.Errors(err) {
		if e.Err == nil {
			e.Err = balancer.ErrInvalidConfig
		}
	}
	return err
}

// find returns the node that set the setting at path ("breaker.threshold",
// "listOfServers[1]") in n, following aliases and merge keys, or nil.
func find(n *yaml.Node, path string) *yaml.Node {
	n = resolve(n)
	if n == nil || path == "" {
		return n
	}
	key, rest, _ := strings.Cut(path, ".")
	if name, idx, ok := strings.Cut(key, "["); ok {
		v := find(n, name)
		i, err := strconv.Atoi(strings.TrimSuffix(idx, "]"))
		if v = resolve(v); v == nil || err != nil || v.Kind != yaml.SequenceNode || i >= len(v.Content) {
			return v // a comma-separated string: its own line
		}
		return find(v.Content[i], rest)
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.Value == key {
			if rest == "" {
				return k
			}
			return find(n.Content[i+1], rest)
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Value == "<<" && k.ShortTag() == "!!merge" {
			merged := resolve(n.Content[i+1])
			list := []*yaml.Node{merged}
			if merged != nil && merged.Kind == yaml.SequenceNode {
				list = merged.Content
			}
			for _, m := range list {
				if found := find(m, path); found != nil {
					return found
				}
			}
		}
	}
	return nil
}

// canonicalNames rewrites rule and filter names written another way
// ("roundrobin", a Ribbon class name) as pushlb's constants, so users of
// the loaded configuration can compare them. Unknown names are left for
// Validate to report.
func canonicalNames(c *balancer.Config) {
	if r, err := balancer.CanonicalRule(c.Rule); err == nil {
		c.Rule = r
	}
	if r, err := balancer.CanonicalRule(c.RetrySubRule); err == nil {
		c.RetrySubRule = r
	}
	if f, err := balancer.CanonicalFilter(c.Filter); err == nil {
		c.Filter = f
	}
}

func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}
