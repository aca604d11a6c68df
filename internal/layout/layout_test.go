package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// module is the main module's path; packages of other modules (the nested
// ones: caddy/, grpc/, xds/, examples/grpc/, e2e/, bench/) are not checked.
const module = "github.com/pushlb/pushlb"

// tier is one row of the import table. Its packages may import those of
// the tiers below it, never those above; the packages of one tier import
// one another only where peers says so.
type tier struct {
	name string
	// packages are paths relative to the module: "" is the root package,
	// "x/..." is x and every package under it.
	packages []string
	// peers: the tier's packages may import one another. The pipeline's
	// rows say no, so that a new arrow between two of them is a decision
	// made here (split the row), not an accident.
	peers bool
	// testOnly: the tier may import anything, and only its own packages and
	// test files (_test.go) import it.
	testOnly bool
	job      string
}

// tiers is the import table, top to bottom; internal/README.md shows it.
// Rows 4 to 8 are the public packages of the push path, ordered by what
// they import: events imports nothing of the module, balancer nothing,
// serverlist events, lbconfig balancer, convergence events, and the edges
// what lies below them.
// Test files may import anything: only each package's non-test imports are
// checked.
var tiers = []tier{
	{name: "commands", packages: []string{"cmd/...", "internal/app/...", "examples/...", "dns"}, peers: true,
		job: "the binaries, the gateway application behind cmd/gateway, the examples, the DNS responder over the embedding API"},
	{name: "cli", packages: []string{"internal/cli/..."}, peers: true,
		job: "what the command lines share: NATS connection flags, gossip flags, log setup"},
	{name: "root", packages: []string{""},
		job: "the embedding API (pushlb.Client); only the commands, the cli and tests import it"},
	{name: "edges", packages: []string{"lbhttp", "lbvisitor", "publisher", "subscriber"},
		job: "where lists and requests cross: publish and subscribe over NATS, apply lists to balancers, proxy HTTP through one"},
	{name: "reports", packages: []string{"convergence"},
		job: "what a gateway reports it applied, a list's digest, and the fleet's view of those reports"},
	{name: "state", packages: []string{"serverlist", "gossip", "balancer/lbconfig"},
		job: "the server registry in NATS KV, the membership gossip, a balancer's configuration"},
	{name: "balancer", packages: []string{"balancer"},
		job: "the balancer: snapshots, rules, picks"},
	{name: "events", packages: []string{"events"},
		job: "the wire protocol and the events every layer shares: the bottom of the public packages"},
	{name: "base", packages: []string{"internal/base/..."}, peers: true,
		job: "small helpers any package may use: strict YAML, a ctx-bounded sleep, comma lists, an expiring set, the NATS pings"},
	{name: "testkit", packages: []string{"internal/testkit/...", "internal/layout"}, peers: true, testOnly: true,
		job: "what tests share, and these tests"},
}

// pkg is what `go list -json` says of one package, the fields read here.
type pkg struct {
	ImportPath string
	Module     *struct{ Path string }
	Imports    []string
	// TestImports and XTestImports are free: a test may import any tier.
	TestImports  []string
	XTestImports []string
	Error        *struct{ Pos, Err string }
}

// violation is a package that breaks the table: an import against it, or
// a package the table does not place.
type violation struct {
	pkg, pkgTier         string // the package at fault and its tier; tier "" when it has none
	imports, importsTier string // what it imports and that tier; "" when the fault is the package itself
	rule                 string
}

func (v violation) String() string {
	if v.imports == "" {
		return fmt.Sprintf("%s: %s", v.pkg, v.rule)
	}
	return fmt.Sprintf("%s (%s) imports %s (%s): %s", v.pkg, v.pkgTier, v.imports, v.importsTier, v.rule)
}

// The rules a violation names.
const (
	ruleUp       = "an import goes down the table, never up"
	rulePeers    = "the packages of this tier do not import one another (split the row in internal/layout/layout_test.go if the arrow is meant)"
	ruleTestOnly = "only test files import this tier (move the import into a _test.go file)"
	ruleNoTier   = "in no tier: place it in the table of internal/layout/layout_test.go and internal/README.md"
)

// tierLabel names tier i as messages show it: `tier 4 "edges"`.
func tierLabel(i int) string { return fmt.Sprintf("tier %d %q", i+1, tiers[i].name) }

// inModule reports whether p is a package of the main module.
func inModule(p pkg) bool { return p.Module != nil && p.Module.Path == module }

// matches reports whether the import path matches a tier's package entry.
func matches(importPath, entry string) bool {
	want := module
	if entry != "" {
		want = module + "/" + entry
	}
	if prefix, ok := strings.CutSuffix(want, "/..."); ok {
		return importPath == prefix || strings.HasPrefix(importPath, prefix+"/")
	}
	return importPath == want
}

// tiersOf returns the indexes of the tiers whose entries match the import
// path: one for a placed package.
func tiersOf(importPath string) []int {
	var in []int
	for i, tr := range tiers {
		if slices.ContainsFunc(tr.packages, func(e string) bool { return matches(importPath, e) }) {
			in = append(in, i)
		}
	}
	return in
}

// checkTiers checks the non-test imports of the main module's packages
// against the table and returns every violation, sorted.
func checkTiers(pkgs []pkg) []violation {
	var out []violation
	for _, p := range pkgs {
		if !inModule(p) {
			continue
		}
		in := tiersOf(p.ImportPath)
		switch len(in) {
		case 0:
			out = append(out, violation{pkg: p.ImportPath, rule: ruleNoTier})
			continue
		case 1:
		default:
			out = append(out, violation{pkg: p.ImportPath, rule: fmt.Sprintf(
				"in %s and %s: the table's rows overlap", tierLabel(in[0]), tierLabel(in[1]))})
			continue
		}
		from := in[0]
		for _, imp := range p.Imports {
			if imp == p.ImportPath || !matches(imp, "...") {
				continue
			}
			to := tiersOf(imp)
			if len(to) == 0 {
				continue // its own listing reports it; an import of no package at all is the compiler's error
			}
			v := violation{pkg: p.ImportPath, pkgTier: tierLabel(from), imports: imp, importsTier: tierLabel(to[0])}
			switch {
			case from == to[0]:
				if tiers[from].peers {
					continue
				}
				v.rule = rulePeers
			case tiers[to[0]].testOnly:
				v.rule = ruleTestOnly
			case tiers[from].testOnly || to[0] > from:
				continue
			default:
				v.rule = ruleUp
			}
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b violation) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// staleEntries returns the table's entries that match no package of the
// module: a row that names a package moved or removed no longer documents
// anything.
func staleEntries(pkgs []pkg) []string {
	var out []string
	for i, tr := range tiers {
		for _, e := range tr.packages {
			found := slices.ContainsFunc(pkgs, func(p pkg) bool { return inModule(p) && matches(p.ImportPath, e) })
			if !found {
				out = append(out, fmt.Sprintf("%s lists %q, which matches no package of the module", tierLabel(i), e))
			}
		}
	}
	return out
}

// TestImportTiers checks the module's packages, as `go list` reads them
// from the checkout, against the table.
func TestImportTiers(t *testing.T) {
	pkgs := listPackages(t)
	for _, v := range checkTiers(pkgs) {
		t.Error(v)
	}
	for _, s := range staleEntries(pkgs) {
		t.Error(s)
	}
}

// TestCheckTiers runs the check on made-up packages, one rule at a time.
func TestCheckTiers(t *testing.T) {
	m := func(rel string) string {
		if rel == "" {
			return module
		}
		return module + "/" + rel
	}
	// p is a package of the main module importing the given packages
	// (relative paths) and, in its tests, testutil.
	p := func(rel string, imports ...string) pkg {
		q := pkg{ImportPath: m(rel), Module: &struct{ Path string }{module}}
		for _, imp := range imports {
			q.Imports = append(q.Imports, m(imp))
		}
		q.TestImports = []string{m("internal/testkit/testutil"), m("")}
		q.XTestImports = []string{m("internal/app/gateway")}
		return q
	}
	// stdlib and other modules' packages are not checked, nor what they import.
	other := pkg{ImportPath: "github.com/other/x", Module: &struct{ Path string }{"github.com/other/x"},
		Imports: []string{m("internal/app/gateway")}}
	nested := pkg{ImportPath: m("caddy"), Module: &struct{ Path string }{module + "/caddy"},
		Imports: []string{m(""), m("internal/testkit/testutil")}}
	std := pkg{ImportPath: "fmt", Imports: []string{"io"}}

	tests := []struct {
		name string
		pkgs []pkg
		want []violation
	}{
		{
			name: "down the table",
			pkgs: []pkg{
				p("cmd/gateway", "internal/app/gateway", "internal/cli/logx"),
				p("internal/app/gateway", "", "internal/app/natsaccounts", "internal/cli/natsconn", "lbhttp", "internal/base/yamlx"),
				p("examples/embed/client", ""),
				p("internal/cli/gossipflag", "gossip", "internal/base/commalist"),
				p("", "lbvisitor", "subscriber", "serverlist", "balancer", "events"),
				p("lbvisitor", "balancer", "serverlist", "events", "fmt"),
				p("balancer/lbconfig", "balancer", "internal/base/yamlx", "internal/base/commalist"),
				p("serverlist", "events", "internal/base/ctxutil"),
				p("internal/base/yamlx", "internal/base/commalist"),
				p("internal/testkit/natstest", "internal/app/natsaccounts", "internal/testkit/testutil"),
				p("internal/testkit/scale", "serverlist", "events"),
				other, nested, std,
			},
		},
		{
			name: "up the table",
			pkgs: []pkg{
				p("events", "balancer"),
				p("internal/base/yamlx", "serverlist"),
				p("", "internal/cli/natsconn"),
				p("serverlist", ""),
				p("internal/cli/logx", "internal/app/gateway"),
			},
			want: []violation{
				{pkg: m(""), pkgTier: `tier 3 "root"`, imports: m("internal/cli/natsconn"), importsTier: `tier 2 "cli"`, rule: ruleUp},
				{pkg: m("events"), pkgTier: `tier 8 "events"`, imports: m("balancer"), importsTier: `tier 7 "balancer"`, rule: ruleUp},
				{pkg: m("internal/base/yamlx"), pkgTier: `tier 9 "base"`, imports: m("serverlist"), importsTier: `tier 6 "state"`, rule: ruleUp},
				{pkg: m("internal/cli/logx"), pkgTier: `tier 2 "cli"`, imports: m("internal/app/gateway"), importsTier: `tier 1 "commands"`, rule: ruleUp},
				{pkg: m("serverlist"), pkgTier: `tier 6 "state"`, imports: m(""), importsTier: `tier 3 "root"`, rule: ruleUp},
			},
		},
		{
			name: "across a pipeline row",
			pkgs: []pkg{p("publisher", "subscriber"), p("gossip", "serverlist")},
			want: []violation{
				{pkg: m("gossip"), pkgTier: `tier 6 "state"`, imports: m("serverlist"), importsTier: `tier 6 "state"`, rule: rulePeers},
				{pkg: m("publisher"), pkgTier: `tier 4 "edges"`, imports: m("subscriber"), importsTier: `tier 4 "edges"`, rule: rulePeers},
			},
		},
		{
			name: "testkit outside tests",
			pkgs: []pkg{p("serverlist", "internal/testkit/testutil"), p("cmd/announce", "internal/testkit/natstest")},
			want: []violation{
				{pkg: m("cmd/announce"), pkgTier: `tier 1 "commands"`, imports: m("internal/testkit/natstest"), importsTier: `tier 10 "testkit"`, rule: ruleTestOnly},
				{pkg: m("serverlist"), pkgTier: `tier 6 "state"`, imports: m("internal/testkit/testutil"), importsTier: `tier 10 "testkit"`, rule: ruleTestOnly},
			},
		},
		{
			name: "a package in no tier",
			pkgs: []pkg{p("emptyguard", "events"), p("", "emptyguard"), p("internal/helpers")},
			want: []violation{
				{pkg: m("emptyguard"), rule: ruleNoTier},
				{pkg: m("internal/helpers"), rule: ruleNoTier},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := checkTiers(tc.pkgs)
			if !slices.Equal(got, tc.want) {
				t.Errorf("checkTiers:\n got %s\nwant %s", lines(got), lines(tc.want))
			}
		})
	}

	t.Run("message", func(t *testing.T) {
		got := checkTiers([]pkg{p("events", "lbhttp")})
		want := module + `/events (tier 8 "events") imports ` + module + `/lbhttp (tier 4 "edges"): ` + ruleUp
		if len(got) != 1 || got[0].String() != want {
			t.Errorf("got %s\nwant %s", lines(got), want)
		}
	})

	t.Run("stale entries", func(t *testing.T) {
		// A package under each "x/..." entry and one for each exact entry
		// but the root's.
		var all []pkg
		for _, tr := range tiers {
			for _, e := range tr.packages {
				if prefix, ok := strings.CutSuffix(e, "/..."); ok {
					all = append(all, p(prefix+"/x"))
				} else if e != "" {
					all = append(all, p(e))
				}
			}
		}
		all = append(all, p("lbhttp/x"), other) // neither is the root
		if got := staleEntries(all); len(got) != 1 || !strings.Contains(got[0], `tier 3 "root" lists ""`) {
			t.Errorf("staleEntries with every entry but the root's matched = %q", got)
		}
	})
}

// lines formats violations one a line, for a failure message.
func lines(vs []violation) string {
	var b strings.Builder
	for _, v := range vs {
		b.WriteString("\n\t" + v.String())
	}
	if b.Len() == 0 {
		return "(none)"
	}
	return b.String()
}

// listPackages runs `go list` over the module's packages. GOWORK=off: a
// go.work a developer keeps above the checkout would add its modules to ./...
func listPackages(t *testing.T) []pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		testutil.Missing(t, "the go command is not on PATH: %v", err)
	}
	env := append(os.Environ(), "GOWORK=off")
	gomod, err := run(t, env, "", goBin, "env", "GOMOD")
	if err != nil {
		t.Fatal(err)
	}
	gomod = strings.TrimSpace(gomod)
	if gomod == "" || gomod == os.DevNull {
		t.Fatalf("go env GOMOD = %q: the test does not run inside the module", gomod)
	}
	out, err := run(t, env, filepath.Dir(gomod), goBin, "list", "-e",
		"-json=ImportPath,Module,Imports,TestImports,XTestImports,Error", "./...")
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var p pkg
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("go list: decoding its output: %v", err)
		}
		if p.Error != nil {
			// Its imports may be incomplete, so the check cannot vouch for it.
			t.Errorf("go list: %s: %s %s", p.ImportPath, p.Error.Pos, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// run runs a command in dir ("" for the test's directory) and returns its
// standard output; an error carries its standard error.
func run(t *testing.T, env []string, dir, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}

// TestNoToolLibraryNames checks that no tracked file names the tool library
// the developers use beside the project: the project reads and builds
// without it, and a reader cannot follow a reference to it. go.mod and
// go.sum are left out: the go command writes them, module paths and hashes.
func TestNoToolLibraryNames(t *testing.T) {
	// Built from pieces, so that this file does not name them itself.
	names := []string{"farm" + "-studio", "farm" + "-bench", "." + "library"}

	gitBin, err := exec.LookPath("git")
	if err != nil {
		testutil.Missing(t, "the git command is not on PATH: %v", err)
	}
	top, err := run(t, os.Environ(), "", gitBin, "rev-parse", "--show-toplevel")
	if err != nil {
		testutil.Missing(t, "not a git checkout: %v", err)
	}
	top = strings.TrimSpace(top)
	list, err := run(t, os.Environ(), top, gitBin, "ls-files", "-z")
	if err != nil {
		t.Fatal(err)
	}
	files := strings.Split(strings.TrimSuffix(list, "\x00"), "\x00")
	if len(files) < 2 {
		t.Fatalf("git ls-files listed %d files", len(files))
	}
	for _, f := range files {
		if base := path.Base(f); base == "go.mod" || base == "go.sum" {
			continue
		}
		data, err := tracked(filepath.Join(top, filepath.FromSlash(f)))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		for _, name := range names {
			if i := bytes.Index(data, []byte(name)); i >= 0 {
				t.Errorf("%s:%d names %q", f, 1+bytes.Count(data[:i], []byte("\n")), name)
			}
		}
	}
}

// tracked reads a tracked file as the checkout holds it: a symbolic link's
// target path, nothing for a file deleted from the work tree (a change not
// yet committed) or a submodule.
func tracked(file string) ([]byte, error) {
	info, err := os.Lstat(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, err
	case info.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(file)
		return []byte(target), err
	case !info.Mode().IsRegular():
		return nil, nil
	}
	return os.ReadFile(file)
}
