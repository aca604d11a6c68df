package yamlx

import (
	"github.com/pushlb/pushlb/internal/base/commalist"

	"encoding"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// walker copies a node tree for yaml.v3 to decode into a Go type: it
// reports unknown keys, applies the package's rules (null keeps, bare 0
// durations, no floats for ints, comma lists) to the copy, and remembers
// each node's key path and type to explain yaml.v3's errors.
type walker struct {
	opts         options
	memo         map[*yaml.Node]*yaml.Node // original -> copy, so aliases stay aliases
	entries      []entry
	unmarshalers []unmarshaler
	errs         []*Error
	merging      map[*yaml.Node]bool // merge sources being layered, against cycles
	work         int                 // pairs layered, against merge bombs
}

// maxMergeWork bounds the key/value pairs merge keys may layer in one
// decode: as yaml.v3 bounds alias expansion, so that a small document of
// merges of merges cannot take forever.
const maxMergeWork = 100_000

// entry is a node of the copy with its key path and the type it decodes
// into (pointers removed); for a mapping key, key is set and t is nil.
type entry struct {
	n    *yaml.Node
	path string
	t    reflect.Type
	key  bool
}

// unmarshaler is a node a type decodes with its own UnmarshalYAML.
type unmarshaler struct {
	path        string
	first, last int // lines
}

var (
	durationType     = reflect.TypeFor[time.Duration]()
	nodeType         = reflect.TypeFor[yaml.Node]()
	unmarshalerType  = reflect.TypeFor[yaml.Unmarshaler]()
	obsoleteType     = reflect.TypeFor[interface{ UnmarshalYAML(func(any) error) error }]()
	textUnmarshalerT = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// node returns the copy of n to decode into a t at path. A nil t copies n
// as it is.
func (w *walker) node(n *yaml.Node, t reflect.Type, path string) *yaml.Node {
	if n == nil {
		return nil
	}
	if c, ok := w.memo[n]; ok {
		return c
	}
	c := new(yaml.Node)
	*c = *n
	c.Content = nil
	w.memo[n] = c
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, item := range n.Content {
			c.Content = append(c.Content, w.node(item, t, path))
		}
		return c
	case yaml.AliasNode:
		c.Alias = w.node(n.Alias, t, path)
		return c
	}
	if t != nil && decodesItself(t, n) {
		w.unmarshalers = append(w.unmarshalers, unmarshaler{path: path, first: n.Line, last: lastLine(n)})
		t = nil
	}
	if t == nil {
		for _, item := range n.Content {
			c.Content = append(c.Content, w.node(item, nil, ""))
		}
		return c
	}
	w.entries = append(w.entries, entry{n: c, path: path, t: t})
	switch n.Kind {
	case yaml.ScalarNode:
		w.scalar(c, t, path)
	case yaml.MappingNode:
		w.mapping(n, c, t, path)
	case yaml.SequenceNode:
		var elem reflect.Type
		if k := t.Kind(); k == reflect.Slice || k == reflect.Array {
			elem = t.Elem()
		}
		for i, item := range n.Content {
			c.Content = append(c.Content, w.node(item, elem, fmt.Sprintf("%s[%d]", path, i)))
		}
	}
	return c
}

// decodesItself reports whether yaml.v3 hands n to t's own decoding, or
// keeps it whole (yaml.Node), or takes anything (an interface).
func decodesItself(t reflect.Type, n *yaml.Node) bool {
	pt := reflect.PointerTo(t)
	switch {
	case t == nodeType, t.Kind() == reflect.Interface:
		return true
	case pt.Implements(unmarshalerType), pt.Implements(obsoleteType):
		return true
	case n.Kind == yaml.ScalarNode && pt.Implements(textUnmarshalerT):
		return true
	}
	return false
}

func (w *walker) scalar(c *yaml.Node, t reflect.Type, path string) {
	tag := c.ShortTag()
	switch {
	case tag == "!!null":
	case t == durationType && tag == "!!int":
		if i, err := strconv.ParseInt(c.Value, 0, 64); err == nil && i == 0 {
			c.Tag = "!!str" // time.ParseDuration reads "0"
		}
	case tag == "!!float" && isInt(t):
		c.Tag = "!!str" // so yaml.v3 refuses it rather than truncate it
	case w.opts.commaLists && tag == "!!str" && t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		items := commalist.Split(c.Value)
		c.Kind, c.Tag, c.Style, c.Value = yaml.SequenceNode, "!!seq", yaml.FlowStyle, ""
		for i, item := range items {
			n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: item, Line: c.Line, Column: c.Column}
			c.Content = append(c.Content, n)
			w.entries = append(w.entries, entry{n: n, path: fmt.Sprintf("%s[%d]", path, i), t: t.Elem()})
		}
	}
}

func (w *walker) mapping(n, c *yaml.Node, t reflect.Type, path string) {
	switch t.Kind() {
	case reflect.Struct:
		w.structMapping(n, c, t, path)
	case reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if isMerge(k) {
				c.Content = append(c.Content, w.node(k, nil, ""), w.merge(v, t, path))
				continue
			}
			c.Content = append(c.Content, w.node(k, nil, ""), w.node(v, t.Elem(), joinPath(path, k.Value)))
		}
	default:
		// yaml.v3 reports the mismatch; copy as it is.
		for _, item := range n.Content {
			c.Content = append(c.Content, w.node(item, nil, ""))
		}
	}
}

// structMapping copies a mapping that sets the fields of a struct t. Merge
// keys are applied here rather than by yaml.v3, so that they merge nested
// structs key by key, as decoding over defaults does.
func (w *walker) structMapping(n, c *yaml.Node, t reflect.Type, path string) {
	fields := fieldsOf(t)
	for i, kv := 0, w.layered([]*yaml.Node{n}, fields, path, 0); i+1 < len(kv); i += 2 {
		k, v := kv[i], kv[i+1]
		key := joinPath(path, k.Value)
		kc := w.node(k, nil, "")
		w.entries = append(w.entries, entry{n: kc, path: key, key: true})
		ft, ok := fields.byName[k.Value]
		if !ok {
			ft = fields.inlineMap
		}
		if isNull(v) && nullable(ft) {
			continue // null keeps what the field holds
		}
		if w.failsOwnDecoding(v, ft, key) {
			continue // reported; the field keeps what it holds
		}
		c.Content = append(c.Content, kc, w.node(v, ft, key))
	}
}

// failsOwnDecoding tries v on a scratch t when t decodes itself
// (yaml.Unmarshaler), and reports its errors at path. yaml.v3 stops the
// whole document at the first error such a type returns, so that a
// mistake in one section would hide the mistakes of every key after it;
// a value that fails is left out of the copy instead, and yaml.v3 decodes
// the rest. A value that decodes is decoded twice (here and by yaml.v3).
func (w *walker) failsOwnDecoding(v *yaml.Node, t reflect.Type, path string) bool {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || isNull(v) || !reflect.PointerTo(t).Implements(unmarshalerType) {
		return false
	}
	err := reflect.New(t).Interface().(yaml.Unmarshaler).UnmarshalYAML(resolve(v))
	if _, collected := err.(*yaml.TypeError); err == nil || collected {
		return false // yaml.v3 collects a *TypeError and goes on
	}
	if inner := Errors(err); len(inner) > 0 {
		for _, e := range inner {
			e.Path = joinPath(path, e.Path)
		}
		w.errs = append(w.errs, inner...)
	} else {
		w.errs = append(w.errs, &Error{Line: v.Line, Path: path, Msg: err.Error(), Err: err})
	}
	return true
}

// layered returns the key/value pairs that maps set, later maps winning:
// for each map, what its merge keys bring and then its own keys. A null
// does not override; two mappings for the same nested struct are layered
// in turn. Unknown and repeated keys are reported and left out.
func (w *walker) layered(maps []*yaml.Node, fields *structFields, path string, depth int) []*yaml.Node {
	var out []*yaml.Node
	at := make(map[string]int)
	for _, m := range maps {
		if w.work += len(m.Content); w.work > maxMergeWork || depth > 50 {
			if w.work < 1<<60 {
				w.errs = append(w.errs, &Error{Line: m.Line, Path: path, Msg: "merge keys (<<) expand too much"})
				w.work = 1 << 60 // report once
			}
			return out
		}
		var sources []*yaml.Node
		for i := 0; i+1 < len(m.Content); i += 2 {
			if !isMerge(m.Content[i]) {
				continue
			}
			v := resolve(m.Content[i+1])
			switch v.Kind {
			case yaml.MappingNode:
				sources = append(sources, v)
			case yaml.SequenceNode: // earlier ones win
				for j := len(v.Content) - 1; j >= 0; j-- {
					sources = append(sources, resolve(v.Content[j]))
				}
			default:
				sources = append(sources, v)
			}
		}
		for _, s := range sources {
			switch {
			case s.Kind != yaml.MappingNode:
				w.errs = append(w.errs, &Error{Line: s.Line, Path: path, Msg: "a merge key (<<) takes a mapping or a list of them, not " + Describe(s)})
			case w.merging[s]:
				w.errs = append(w.errs, &Error{Line: s.Line, Path: path, Msg: "a merge key (<<) brings the mapping it is in"})
			default:
				if w.merging == nil {
					w.merging = make(map[*yaml.Node]bool)
				}
				w.merging[m], w.merging[s] = true, true
				out = w.setAll(out, at, w.layered([]*yaml.Node{s}, fields, path, depth+1), fields, path, depth)
				delete(w.merging, s)
			}
		}
		delete(w.merging, m)
		var own []*yaml.Node
		first := make(map[string]int)
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			if isMerge(k) {
				continue
			}
			key := joinPath(path, k.Value)
			if line, dup := first[k.Value]; dup {
				w.errs = append(w.errs, &Error{Line: k.Line, Path: key, Msg: fmt.Sprintf("repeated key (first at line %d)", line)})
				continue
			}
			first[k.Value] = k.Line
			if _, ok := fields.byName[k.Value]; !ok && fields.inlineMap == nil {
				w.errs = append(w.errs, &Error{Line: k.Line, Path: key, Msg: unknownKey(k.Value, fields.names)})
				continue
			}
			own = append(own, k, v)
		}
		out = w.setAll(out, at, own, fields, path, depth)
	}
	return out
}

// setAll sets the pairs kv over out (indexed by at).
func (w *walker) setAll(out []*yaml.Node, at map[string]int, kv []*yaml.Node, fields *structFields, path string, depth int) []*yaml.Node {
	for i := 0; i+1 < len(kv); i += 2 {
		k, v := kv[i], kv[i+1]
		j, ok := at[k.Value]
		if !ok {
			at[k.Value] = len(out)
			out = append(out, k, v)
			continue
		}
		old := resolve(out[j+1])
		switch {
		case isNull(v):
		case isNull(old):
			out[j], out[j+1] = k, v
		default:
			ft := fields.byName[k.Value]
			for ft != nil && ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			nv := resolve(v)
			if ft != nil && ft.Kind() == reflect.Struct && !decodesItself(ft, nv) &&
				old.Kind == yaml.MappingNode && nv.Kind == yaml.MappingNode {
				merged := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: nv.Line, Column: nv.Column}
				merged.Content = w.layered([]*yaml.Node{old, nv}, fieldsOf(ft), joinPath(path, k.Value), depth+1)
				out[j], out[j+1] = k, merged
				continue
			}
			out[j], out[j+1] = k, v
		}
	}
	return out
}

func isMerge(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge"
}

func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// merge copies the value of a merge key (<<) in a map: a mapping, an alias
// of one, or a list of them, each over the map type t.
func (w *walker) merge(v *yaml.Node, t reflect.Type, path string) *yaml.Node {
	if v.Kind != yaml.SequenceNode {
		return w.node(v, t, path)
	}
	c := new(yaml.Node)
	*c = *v
	c.Content = nil
	for _, item := range v.Content {
		c.Content = append(c.Content, w.node(item, t, path))
	}
	return c
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// nullable reports whether yaml.v3 would reset a t to nil on a null.
func nullable(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Slice, reflect.Map, reflect.Pointer, reflect.Interface:
		return true
	}
	return false
}

func isInt(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

func lastLine(n *yaml.Node) int {
	last := n.Line
	for _, item := range n.Content {
		last = max(last, lastLine(item))
	}
	return last
}

// structFields are the YAML keys of a struct type, by yaml.v3's rules: the
// tag's name, else the lower-cased field name; "-" skips a field;
// ",inline" flattens a struct (or pointer to one) or takes the other keys
// into a map.
type structFields struct {
	byName    map[string]reflect.Type
	names     []string // sorted
	inlineMap reflect.Type
}

func fieldsOf(t reflect.Type) *structFields {
	f := &structFields{byName: make(map[string]reflect.Type)}
	f.add(t)
	for name := range f.byName {
		f.names = append(f.names, name)
	}
	slices.Sort(f.names)
	return f
}

func (f *structFields) add(t reflect.Type) {
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() && !sf.Anonymous {
			continue
		}
		tag := sf.Tag.Get("yaml")
		if tag == "" && !strings.Contains(string(sf.Tag), ":") {
			tag = string(sf.Tag)
		}
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if slices.Contains(strings.Split(opts, ","), "inline") {
			ft := sf.Type
			switch {
			case ft.Kind() == reflect.Map:
				f.inlineMap = ft.Elem()
			case ft.Kind() == reflect.Struct:
				f.add(ft)
			case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
				f.add(ft.Elem())
			}
			continue
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		f.byName[name] = sf.Type
	}
}

// unknownKey explains an unknown key, with the closest known one or, when
// none is close and there are few, the list of them.
func unknownKey(key string, known []string) string {
	if s := Suggest(key, known); s != "" {
		return fmt.Sprintf("unknown key (did you mean %q?)", s)
	}
	if len(known) > 0 && len(known) <= 6 {
		return fmt.Sprintf("unknown key (the keys here are %s)", strings.Join(known, ", "))
	}
	return "unknown key"
}

// Suggest returns the candidate closest to key (the same in another case,
// a small edit distance, or, for a key of 4 letters or more, the shortest
// candidate it begins), or "" when none is close.
func Suggest(key string, candidates []string) string {
	best, bestDist := "", 0
	lk := strings.ToLower(key)
	for _, c := range candidates {
		lc := strings.ToLower(c)
		if lc == lk {
			return c
		}
		d := editDistance(lk, lc)
		if d <= max(2, len(lk)/5) && (best == "" || d < bestDist) {
			best, bestDist = c, d
		}
	}
	if best == "" && len(lk) >= 4 {
		for _, c := range candidates {
			if strings.HasPrefix(strings.ToLower(c), lk) && (best == "" || len(c) < len(best)) {
				best = c
			}
		}
	}
	return best
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
