package pushlb_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb"
)

// embeddingDoc returns docs/embedding.md.
func embeddingDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("docs/embedding.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docDefault renders a default as the Config table writes it.
func docDefault(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case time.Duration:
		return x.String()
	case string:
		return fmt.Sprintf("%q", x)
	}
	switch v.Kind() {
	case reflect.String: // a string type of its own (FollowMode)
		return fmt.Sprintf("%q", v.String())
	case reflect.Pointer, reflect.Slice, reflect.Map:
		if v.IsNil() {
			return "nil"
		}
	}
	return fmt.Sprint(v.Interface())
}

// configFields lists Config's fields as the table names them, nested
// structs flattened ("Limits.Services"), with DefaultConfig's values.
func configFields(prefix string, v reflect.Value, out map[string]reflect.Value) {
	for i := range v.NumField() {
		f, fv := v.Type().Field(i), v.Field(i)
		if fv.Kind() == reflect.Struct && f.Type.PkgPath() == reflect.TypeFor[pushlb.Config]().PkgPath() {
			configFields(prefix+f.Name+".", fv, out)
			continue
		}
		out[prefix+f.Name] = fv
	}
}

// TestEmbeddingDocMatchesDefaultConfig: docs/embedding.md's Config table
// has a row for every field, with DefaultConfig's value, so the defaults
// are written in one place and the doc cannot drift from it.
func TestEmbeddingDocMatchesDefaultConfig(t *testing.T) {
	doc := embeddingDoc(t)
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Za-z.]+)` \\| `([^`]*)` \\|").FindAllStringSubmatch(doc, -1) {
		rows[m[1]] = m[2]
	}
	fields := map[string]reflect.Value{}
	configFields("", reflect.ValueOf(pushlb.DefaultConfig()), fields)
	for name, v := range fields {
		got, ok := rows[name]
		if !ok {
			t.Errorf("docs/embedding.md has no row for Config.%s", name)
			continue
		}
		want := docDefault(v)
		if name == "Balancers" {
			want = "balancer.DefaultClientsConfig()" // a value too large for a cell
		}
		if got != want {
			t.Errorf("docs/embedding.md: Config.%s defaults to `%s`, DefaultConfig says `%s`", name, got, want)
		}
	}
}

// TestEmbeddingDocListsEveryOption: every exported function that returns
// an Option has a row in docs/embedding.md.
func TestEmbeddingDocListsEveryOption(t *testing.T) {
	doc := embeddingDoc(t)
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range pkgs["pushlb"].Files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Type.Results == nil || len(fn.Type.Results.List) != 1 {
				continue
			}
			if id, ok := fn.Type.Results.List[0].Type.(*ast.Ident); !ok || id.Name != "Option" {
				continue
			}
			n++
			if !strings.Contains(doc, "| `"+fn.Name.Name+"(") {
				t.Errorf("docs/embedding.md has no row for the option %s", fn.Name.Name)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no option in the package")
	}
}
