package yamlx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Option changes how a document is decoded.
type Option func(*options)

type options struct {
	commaLists bool
	path       string
	check      func() error
}

// CommaLists lets a []string be written as one comma-separated string:
// "a:1, b:2" reads as ["a:1", "b:2"] (items trimmed, empty ones dropped),
// as Ribbon writes listOfServers.
func CommaLists() Option { return func(o *options) { o.commaLists = true } }

// AtPath says where the decoded node sits in its document, so that error
// paths start there: with AtPath("clients.orders"), an unknown key reads
// "clients.orders.rul".
func AtPath(path string) Option { return func(o *options) { o.path = path } }

// Check adds the checks decoding cannot make (a duration below a minimum,
// settings that conflict), so that one pass reports every mistake of a
// document in line order, each where it is written. After decoding, also
// when decoding found errors (out then holds what could be decoded),
// check is called; each *Error it returns (alone or joined) without a line
// is placed at the key its Path names (from the decoded root), or at the
// nearest key above it that the document writes. One about a key that
// decoding already reported is left out. Another error is reported as it
// is, without a line. A document that cannot be parsed is not checked.
func Check(check func() error) Option { return func(o *options) { o.check = check } }

// DecodeFile decodes data, the content of the file path, into out (a
// non-nil pointer) with the rules of the package comment. The file must
// hold at most one YAML document; an empty one leaves out as it is. Every
// error is an *Error naming path, wrapping ErrInvalid; several come joined
// in line order. On error, out may be partly changed.
func DecodeFile(path string, data []byte, out any, opts ...Option) error {
	doc, err := parseOne(data)
	if err == nil && doc != nil {
		err = DecodeNode(doc, out, opts...)
	}
	for _, e := range Errors(err) {
		if e.File == "" {
			e.File = path
		}
	}
	return err
}

// Parse reads data as one YAML document, for a caller that walks the tree
// before decoding parts of it with DecodeNode. It returns nil for an empty
// document; errors are *Error values wrapping ErrInvalid.
func Parse(data []byte) (*yaml.Node, error) { return parseOne(data) }

func parseOne(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, otherError(err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, otherError(err)
	default:
		return nil, &Error{Line: extra.Line, Msg: "a second YAML document; the file must hold one"}
	}
	return &doc, nil
}

// DecodeNode decodes n into out (a non-nil pointer) with the rules of the
// package comment. A nil, empty or null node leaves out as it is. Errors
// are *Error values wrapping ErrInvalid, with the line and the key path
// (from AtPath's, else from n); several come joined in line order. On
// error, out may be partly changed. n itself is not changed.
func DecodeNode(n *yaml.Node, out any, opts ...Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	rv := reflect.ValueOf(out)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("yamlx: DecodeNode needs a non-nil pointer, not %T", out)
	}
	if n == nil || n.Kind == 0 {
		return nil
	}
	w := &walker{opts: o, memo: make(map[*yaml.Node]*yaml.Node)}
	c := w.node(n, rv.Type().Elem(), o.path)
	errs := w.errs
	if err := c.Decode(out); err != nil {
		errs = append(errs, w.translate(err)...)
	}
	if o.check != nil {
		errs = append(errs, w.place(o.check(), errs)...)
	}
	return join(errs)
}

// place returns the errors of a check (see Check) on the lines of their
// keys, leaving out those about a key in reported.
func (w *walker) place(err error, reported []*Error) []*Error {
	var out []*Error
	var visit func(error)
	visit = func(err error) {
		switch e := err.(type) {
		case nil:
		case *Error:
			e.Path = joinPath(w.opts.path, e.Path)
			if slices.ContainsFunc(reported, func(r *Error) bool { return r.Path == e.Path }) {
				return
			}
			if e.Line == 0 {
				e.Line = w.lineOf(e.Path)
			}
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				visit(inner)
			}
		default:
			out = append(out, &Error{Msg: err.Error(), Err: err})
		}
	}
	visit(err)
	return out
}

// lineOf returns the line of the key at path, or of the nearest key above
// it that the document writes ("routes[2]" is its item's line); 0 when
// the document writes none of them.
func (w *walker) lineOf(path string) int {
	for path != "" {
		for _, e := range w.entries {
			if e.path == path && e.n.Line > 0 {
				return e.n.Line // a key's entry comes before its value's
			}
		}
		for _, u := range w.unmarshalers {
			if u.path == path {
				return u.first
			}
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// join returns nil, the one error, or the errors joined in line order.
func join(errs []*Error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	slices.SortStableFunc(errs, func(a, b *Error) int { return a.Line - b.Line })
	list := make([]error, 0, len(errs))
	seen := make(map[string]bool)
	for _, e := range errs {
		if msg := e.Error(); !seen[msg] { // a merged mapping's, met twice
			seen[msg] = true
			list = append(list, e)
		}
	}
	if len(list) == 1 {
		return list[0]
	}
	return errors.Join(list...)
}

var (
	reUnmarshal = regexp.MustCompile("^line (\\d+): cannot unmarshal (\\S+?)(?: `(.*)`)? into (.+)$")
	reDefined   = regexp.MustCompile(`^line (\d+): mapping key (.+) already defined at line (\d+)$`)
	reSet       = regexp.MustCompile(`^line (\d+): field (.+) already set in type .+$`)
	reLine      = regexp.MustCompile(`^line (\d+): (.*)$`)
)

// translate turns a yaml.v3 decoding error into *Errors that name the key.
func (w *walker) translate(err error) []*Error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		out := make([]*Error, 0, len(te.Errors))
		for _, s := range te.Errors {
			out = append(out, w.typeError(s))
		}
		return out
	}
	// An UnmarshalYAML's own error (yaml.v3 stops at the first).
	if inner := Errors(err); len(inner) > 0 {
		for _, e := range inner {
			if u := w.unmarshalerAt(e.Line); u != nil {
				e.Path = joinPath(u.path, e.Path)
			}
		}
		return inner
	}
	if len(w.unmarshalers) == 1 && !strings.HasPrefix(err.Error(), "yaml: ") {
		u := w.unmarshalers[0]
		return []*Error{{Line: u.first, Path: u.path, Msg: err.Error(), Err: err}}
	}
	return []*Error{otherError(err)}
}

// otherError turns yaml's "yaml: line 3: did not find expected key" into
// an *Error on line 3.
func otherError(err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := reLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Line: line, Msg: "invalid YAML: " + m[2]}
	}
	return &Error{Msg: "invalid YAML: " + msg}
}

func (w *walker) typeError(s string) *Error {
	if m := reUnmarshal.FindStringSubmatch(s); m != nil {
		line, _ := strconv.Atoi(m[1])
		if e := w.valueAt(line, m[2], m[3], m[4]); e != nil {
			return &Error{Line: line, Path: e.path, Msg: valueMsg(e.n, e.t)}
		}
	}
	if m := reDefined.FindStringSubmatch(s); m != nil {
		line, _ := strconv.Atoi(m[1])
		key, err := strconv.Unquote(m[2])
		if err != nil {
			key = m[2]
		}
		return &Error{Line: line, Path: w.keyPath(line, key), Msg: fmt.Sprintf("repeated key (first at line %s)", m[3])}
	}
	if m := reSet.FindStringSubmatch(s); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Line: line, Path: w.keyPath(line, m[2]), Msg: "set twice (through a merge key or an inlined struct)"}
	}
	if m := reLine.FindStringSubmatch(s); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Line: line, Msg: m[2]}
	}
	return &Error{Msg: s}
}

// valueAt finds the value yaml.v3 could not decode: on line, into a type
// named typeName, written as value (maybe cut to 7 bytes and "...").
func (w *walker) valueAt(line int, tag, value, typeName string) *entry {
	var (
		best      *entry
		bestScore int
	)
	for i := range w.entries {
		e := &w.entries[i]
		if e.key || e.n.Line != line || e.t == nil {
			continue
		}
		score := 1
		if e.t.String() == typeName {
			score += 2
		}
		cut, short := strings.CutSuffix(value, "...")
		if value != "" && (e.n.Value == value || short && strings.HasPrefix(e.n.Value, cut)) {
			score++
		}
		if (tag == "!!map") == (e.n.Kind == yaml.MappingNode) && (tag == "!!seq") == (e.n.Kind == yaml.SequenceNode) {
			score++
		}
		if score > bestScore {
			best, bestScore = e, score
		}
	}
	return best
}

// keyPath returns the path of the key written key on line, or key.
func (w *walker) keyPath(line int, key string) string {
	for _, e := range w.entries {
		if e.key && e.n.Line == line && e.n.Value == key {
			return e.path
		}
	}
	return key
}

func (w *walker) unmarshalerAt(line int) *unmarshaler {
	var best *unmarshaler
	for i := range w.unmarshalers {
		u := &w.unmarshalers[i]
		if u.first <= line && line <= u.last && (best == nil || u.first >= best.first) {
			best = u
		}
	}
	return best
}

// valueMsg says why n cannot be a t.
func valueMsg(n *yaml.Node, t reflect.Type) string {
	what := Describe(n)
	scalar := n.Kind == yaml.ScalarNode
	if t == durationType {
		if scalar {
			return fmt.Sprintf("%q is not a duration (write it with a unit, e.g. 30s)", n.Value)
		}
		return "want a duration, not " + what
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		switch {
		case !scalar:
			return "want a whole number, not " + what
		case n.ShortTag() == "!!int":
			return fmt.Sprintf("%s is out of range for %s", n.Value, t.Kind())
		}
		return fmt.Sprintf("%q is not a whole number", n.Value)
	case reflect.Bool:
		if !scalar {
			return "want true or false, not " + what
		}
		return fmt.Sprintf("%q is not a boolean (want true or false)", n.Value)
	case reflect.Float32, reflect.Float64:
		if !scalar {
			return "want a number, not " + what
		}
		return fmt.Sprintf("%q is not a number", n.Value)
	case reflect.String:
		return "want a single value, not " + what
	case reflect.Slice, reflect.Array:
		return "want a list, not " + what
	case reflect.Struct:
		return "want a mapping of settings, not " + what
	case reflect.Map:
		return "want a mapping, not " + what
	}
	return fmt.Sprintf("cannot use %s as %s", what, t)
}

// Describe names what a node is for an error message: "a mapping", "a
// list", or its quoted value.
func Describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "an unsupported YAML node"
}

func joinPath(path, key string) string {
	switch {
	case path == "":
		return key
	case key == "":
		return path
	case strings.HasPrefix(key, "["):
		return path + key
	}
	return path + "." + key
}
