package balancer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ClientsConfig is the configuration of every client (service) a gateway
// balances over: global defaults and per-client settings. It is what
// [LoadConfigYAML], [LoadRibbonProperties] and [LoadConfigFile] return and
// what [NewFactory] takes.
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
// ("30s", "500ms"). A key left out or set to null keeps the inherited
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

// canonicalNames rewrites rule and filter names written another way
// ("roundrobin", a Ribbon class name) as pushlb's constants, so users of
// the loaded configuration can compare them. Unknown names are left for
// Validate to report.
func canonicalNames(c *Config) {
	if r, err := canonicalRule(c.Rule); err == nil {
		c.Rule = r
	}
	if r, err := canonicalRule(c.RetrySubRule); err == nil {
		c.RetrySubRule = r
	}
	if f, err := canonicalFilter(c.Filter); err == nil {
		c.Filter = f
	}
}

// cloneConfig copies the reference-typed fields of a Config, so that copies
// share nothing.
func cloneConfig(c Config) Config {
	c.ListOfServers = slices.Clone(c.ListOfServers)
	return c
}

// LoadConfigYAML reads a YAML configuration (see [ClientsConfig] for the
// format). An empty document gives DefaultClientsConfig(). Every resulting
// Config is validated. Errors name the client and the key, and the line
// where the YAML has one; they wrap ErrInvalidConfig, except errors
// reading r.
func LoadConfigYAML(r io.Reader) (*ClientsConfig, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("balancer: reading YAML config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return DefaultClientsConfig(), nil
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	default:
		return nil, fmt.Errorf("%w: line %d: a second YAML document; the configuration must be one document",
			ErrInvalidConfig, extra.Line)
	}
	return decodeClientsYAML(&doc)
}

// UnmarshalYAML implements yaml.Unmarshaler, so a ClientsConfig can be a
// field of a larger YAML configuration and be decoded with the same rules
// as LoadConfigYAML. Decoding starts from DefaultClientsConfig(), not from
// the receiver's current content.
func (c *ClientsConfig) UnmarshalYAML(n *yaml.Node) error {
	out, err := decodeClientsYAML(n)
	if err != nil {
		return err
	}
	*c = *out
	return nil
}

// LoadConfigFile reads the configuration file at path: YAML for a .yaml or
// .yml extension, Ribbon properties for .properties. Errors name the path.
func LoadConfigFile(path string) (*ClientsConfig, error) {
	var load func(io.Reader) (*ClientsConfig, error)
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		load = LoadConfigYAML
	case ".properties":
		load = LoadRibbonProperties
	default:
		return nil, fmt.Errorf("%w: %s: unknown kind of file (want .yaml, .yml or .properties)", ErrInvalidConfig, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("balancer: %w", err)
	}
	defer f.Close()
	cfg, err := load(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// decodeClientsYAML decodes a document with the top-level keys "defaults"
// and "clients".
func decodeClientsYAML(n *yaml.Node) (*ClientsConfig, error) {
	out := DefaultClientsConfig()
	n = resolveAlias(n)
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return out, nil
		}
		n = resolveAlias(n.Content[0])
	}
	if isNull(n) {
		return out, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: line %d: the configuration must be a mapping with the keys \"defaults\" and \"clients\", not %s",
			ErrInvalidConfig, n.Line, describeNode(n))
	}
	var defaults, clients *yaml.Node
	seen := make(map[string]int)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if line, dup := seen[k.Value]; dup {
			return nil, fmt.Errorf("%w: line %d: key %q repeated (first at line %d)", ErrInvalidConfig, k.Line, k.Value, line)
		}
		seen[k.Value] = k.Line
		switch k.Value {
		case "defaults":
			defaults = v
		case "clients":
			clients = v
		default:
			return nil, fmt.Errorf("%w: line %d: unknown key %q%s (the top level has \"defaults\" and \"clients\")",
				ErrInvalidConfig, k.Line, k.Value, suggestion(k.Value, []string{"defaults", "clients"}))
		}
	}
	if defaults != nil {
		d := yamlDecoder{scope: "defaults"}
		if err := d.value(defaults, reflect.ValueOf(&out.Defaults).Elem(), ""); err != nil {
			return nil, err
		}
		canonicalNames(&out.Defaults)
		if err := out.Defaults.Validate(); err != nil {
			return nil, fmt.Errorf("defaults: %w", err)
		}
	}
	if clients == nil {
		return out, nil
	}
	clients = resolveAlias(clients)
	if isNull(clients) {
		return out, nil
	}
	if clients.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: line %d: clients must be a mapping of client names to settings, not %s",
			ErrInvalidConfig, clients.Line, describeNode(clients))
	}
	var errs []error
	clear(seen)
	for i := 0; i+1 < len(clients.Content); i += 2 {
		k, v := clients.Content[i], clients.Content[i+1]
		name := k.Value
		if k.Kind != yaml.ScalarNode || name == "" {
			errs = append(errs, fmt.Errorf("%w: line %d: a client name must be a non-empty string", ErrInvalidConfig, k.Line))
			continue
		}
		if line, dup := seen[name]; dup {
			errs = append(errs, fmt.Errorf("%w: line %d: client %q repeated (first at line %d)", ErrInvalidConfig, k.Line, name, line))
			continue
		}
		seen[name] = k.Line
		cfg := cloneConfig(out.Defaults)
		d := yamlDecoder{scope: fmt.Sprintf("client %q", name)}
		if err := d.value(v, reflect.ValueOf(&cfg).Elem(), ""); err != nil {
			errs = append(errs, err)
			continue
		}
		canonicalNames(&cfg)
		if err := cfg.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("client %q: %w", name, err))
			continue
		}
		out.Clients[name] = cfg
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

var durationType = reflect.TypeFor[time.Duration]()

// yamlDecoder decodes YAML nodes onto a Config field by field. It does the
// work of yaml.v3's Node.Decode, which has no strict mode (KnownFields is a
// Decoder option only), and names the key in every error.
type yamlDecoder struct {
	scope string // "defaults" or `client "orders"`
}

func (d *yamlDecoder) errorf(n *yaml.Node, path, format string, args ...any) error {
	where := fmt.Sprintf("line %d", n.Line)
	if path != "" {
		where = fmt.Sprintf("%s (line %d)", path, n.Line)
	}
	return fmt.Errorf("%s: %w: %s: %s", d.scope, ErrInvalidConfig, where, fmt.Sprintf(format, args...))
}

// value decodes n onto v. A null keeps v as it is.
func (d *yamlDecoder) value(n *yaml.Node, v reflect.Value, path string) error {
	n = resolveAlias(n)
	if isNull(n) {
		return nil
	}
	switch {
	case v.Type() == durationType:
		return d.duration(n, v, path)
	case v.Kind() == reflect.Struct:
		return d.mapping(n, v, path)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		return d.strings(n, v, path)
	}
	if n.Kind != yaml.ScalarNode {
		return d.errorf(n, path, "want a single value, not %s", describeNode(n))
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if err := n.Decode(&b); err != nil {
			return d.errorf(n, path, "%q is not a boolean (want true or false)", n.Value)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var i int64
		if n.ShortTag() != "!!int" || n.Decode(&i) != nil {
			return d.errorf(n, path, "%q is not a whole number", n.Value)
		}
		if v.OverflowInt(i) {
			return d.errorf(n, path, "%s is out of range", n.Value)
		}
		v.SetInt(i)
	case reflect.Float32, reflect.Float64:
		var f float64
		if tag := n.ShortTag(); (tag != "!!int" && tag != "!!float") || n.Decode(&f) != nil {
			return d.errorf(n, path, "%q is not a number", n.Value)
		}
		v.SetFloat(f)
	default:
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return d.errorf(n, path, "%v", err)
		}
	}
	return nil
}

func (d *yamlDecoder) duration(n *yaml.Node, v reflect.Value, path string) error {
	const hint = `write durations with a unit, like "30s" or "500ms"`
	if n.Kind != yaml.ScalarNode {
		return d.errorf(n, path, "want a duration, not %s (%s)", describeNode(n), hint)
	}
	switch n.ShortTag() {
	case "!!str":
		dur, err := time.ParseDuration(strings.TrimSpace(n.Value))
		if err != nil {
			return d.errorf(n, path, "%q is not a duration (%s)", n.Value, hint)
		}
		v.SetInt(int64(dur))
	case "!!int":
		var i int64
		if err := n.Decode(&i); err != nil || i != 0 {
			return d.errorf(n, path, "%s has no unit (%s)", n.Value, hint)
		}
		v.SetInt(0)
	default:
		return d.errorf(n, path, "%q is not a duration (%s)", n.Value, hint)
	}
	return nil
}

// strings decodes a sequence of strings, or one comma-separated string.
func (d *yamlDecoder) strings(n *yaml.Node, v reflect.Value, path string) error {
	var list []string
	switch n.Kind {
	case yaml.SequenceNode:
		list = make([]string, 0, len(n.Content))
		for i, item := range n.Content {
			item = resolveAlias(item)
			if item.Kind != yaml.ScalarNode || isNull(item) {
				return d.errorf(item, fmt.Sprintf("%s[%d]", path, i), "want a string, not %s", describeNode(item))
			}
			list = append(list, item.Value)
		}
	case yaml.ScalarNode:
		list = splitList(n.Value)
	default:
		return d.errorf(n, path, "want a list, not %s", describeNode(n))
	}
	if len(list) == 0 {
		v.Set(reflect.Zero(v.Type())) // [] and nil both mean none; keep one form
		return nil
	}
	s := reflect.MakeSlice(v.Type(), len(list), len(list))
	for i, item := range list {
		s.Index(i).SetString(item)
	}
	v.Set(s)
	return nil
}

// mapping decodes a mapping onto the struct v: merge keys first, so that
// the mapping's own keys override what they bring.
func (d *yamlDecoder) mapping(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.MappingNode {
		return d.errorf(n, path, "want a mapping of settings, not %s", describeNode(n))
	}
	fields := yamlFields(v.Type())
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		if isMergeKey(n.Content[i]) {
			errs = append(errs, d.merge(n.Content[i+1], v, path))
		}
	}
	seen := make(map[string]int)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if isMergeKey(k) {
			continue
		}
		key := joinPath(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			errs = append(errs, d.errorf(k, path, "a key must be a string, not %s", describeNode(k)))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			errs = append(errs, d.errorf(k, key, "repeated key (first at line %d)", line))
			continue
		}
		seen[k.Value] = k.Line
		idx, ok := fields[k.Value]
		if !ok {
			names := make([]string, 0, len(fields))
			for name := range fields {
				names = append(names, joinPath(path, name))
			}
			slices.Sort(names)
			errs = append(errs, fmt.Errorf("%s: %w: line %d: unknown key %q%s",
				d.scope, ErrInvalidConfig, k.Line, key, suggestion(key, names)))
			continue
		}
		errs = append(errs, d.value(val, v.FieldByIndex(idx), key))
	}
	return errors.Join(errs...)
}

// merge applies the value of a merge key (<<): a mapping or a list of
// them, earlier ones winning.
func (d *yamlDecoder) merge(n *yaml.Node, v reflect.Value, path string) error {
	n = resolveAlias(n)
	switch n.Kind {
	case yaml.MappingNode:
		return d.mapping(n, v, path)
	case yaml.SequenceNode:
		var errs []error
		for i := len(n.Content) - 1; i >= 0; i-- {
			m := resolveAlias(n.Content[i])
			if m.Kind != yaml.MappingNode {
				errs = append(errs, d.errorf(m, path, "a merge key (<<) takes mappings, not %s", describeNode(m)))
				continue
			}
			errs = append(errs, d.mapping(m, v, path))
		}
		return errors.Join(errs...)
	}
	return d.errorf(n, path, "a merge key (<<) takes a mapping, not %s", describeNode(n))
}

// yamlFields maps the YAML keys of a struct type to field indexes, with
// yaml.v3's rules: the tag's name, else the lower-cased field name; "-"
// skips a field; ",inline" flattens a struct.
func yamlFields(t reflect.Type) map[string][]int {
	out := make(map[string][]int)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if slices.Contains(strings.Split(opts, ","), "inline") && f.Type.Kind() == reflect.Struct {
			for k, idx := range yamlFields(f.Type) {
				out[k] = append([]int{i}, idx...)
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = []int{i}
	}
	return out
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func isMergeKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge"
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unsupported YAML node"
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// splitList splits a comma-separated list, trimming the items and dropping
// empty ones (Ribbon's listOfServers format).
func splitList(s string) []string {
	parts := strings.Split(s, ",")
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// suggestion returns `; did you mean "x"?` for the candidate closest to key
// (same letters in another case, a small edit distance, or a candidate key
// begins), or "".
func suggestion(key string, candidates []string) string {
	best, bestDist := "", 0
	lk := strings.ToLower(key)
	for _, c := range candidates {
		lc := strings.ToLower(c)
		if lc == lk {
			return fmt.Sprintf("; did you mean %q?", c)
		}
		d := editDistance(lk, lc)
		if d <= max(2, len(lk)/5) && (best == "" || d < bestDist) {
			best, bestDist = c, d
		}
	}
	if best == "" && len(lk) >= 4 {
		// A truncated key: the shortest candidate it begins.
		for _, c := range candidates {
			if strings.HasPrefix(strings.ToLower(c), lk) && (best == "" || len(c) < len(best)) {
				best = c
			}
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
