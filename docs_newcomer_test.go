package pushlb_test

// The docs as a newcomer runs them: what their commands build, and how a
// module of one's own depends on this one. These tests read files and run
// commands (git, go) only.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// shComment is a shell comment: a # that starts a word, to the line's end.
var shComment = regexp.MustCompile(`(^|\s)#.*$`)

// shStmt is a statement of a markdown file's sh block.
type shStmt struct {
	text  string
	line  int // in the file
	block int // the block's number: a block starts in the repository's root
}

// shStatements returns the statements of the sh blocks of a markdown
// text, comments removed, split on newlines, ";", "&&" and "||", with a
// subshell's parentheses and a trailing "&" dropped.
func shStatements(md string) []shStmt {
	var out []shStmt
	inBlock, block := false, 0
	for i, line := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock = !inBlock && strings.TrimPrefix(line, "```") == "sh"
			block++
			continue
		case !inBlock:
			continue
		}
		line = shComment.ReplaceAllString(line, "")
		for _, s := range shSeparator.Split(line, -1) {
			s = strings.TrimSpace(strings.Trim(strings.TrimSpace(s), "()&"))
			if s != "" {
				out = append(out, shStmt{text: s, line: i + 1, block: block})
			}
		}
	}
	return out
}

// shSeparator separates the statements of a line.
var shSeparator = regexp.MustCompile(`;|&&|\|\|`)

// gitRoot returns the repository's root, or ends the test when git or the
// checkout is missing.
func gitRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		testutil.Missing(t, "not a git checkout, or no git: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestDocBuildOutputIgnored: every file the go build commands of the
// markdown files write inside the repository (bin/..., caddy/caddy) is
// ignored by git, so that following the docs leaves no untracked file. The
// commands' directory is followed through cd and go -C.
func TestDocBuildOutputIgnored(t *testing.T) {
	root := gitRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "*.md").Output()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range strings.Fields(string(out)) {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		cwd, block := root, -1 // the block's directory, followed through cd
		for _, st := range shStatements(string(b)) {
			if st.block != block {
				cwd, block = root, st.block
			}
			words := strings.Fields(st.text)
			switch {
			case words[0] == "cd" && len(words) == 2:
				cwd = filepath.Join(cwd, words[1])
				continue
			case words[0] != "go":
				continue
			}
			target, ok := buildOutput(cwd, words)
			if !ok {
				continue
			}
			rel, err := filepath.Rel(root, target)
			if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
				continue // outside the repository (/tmp/gw)
			}
			checked++
			err = exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", rel).Run()
			if err != nil {
				t.Errorf("%s:%d: %q writes %s, which .gitignore does not ignore", file, st.line, st.text, rel)
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no go build writing inside the repository in the docs")
	}
}

// buildOutput returns the file a go build or go test -c command run in
// dir writes (for -o DIR/, a file in DIR), and false for another command
// or one that writes nothing.
func buildOutput(dir string, words []string) (string, bool) {
	var sub, out string
	var pkgs []string
	for i := 1; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "-C" && i+1 < len(words):
			i++
			dir = filepath.Join(dir, words[i])
		case w == "-o" && i+1 < len(words):
			i++
			out = words[i]
		case sub == "":
			sub = w
		case !strings.HasPrefix(w, "-"):
			pkgs = append(pkgs, w)
		}
	}
	switch {
	case sub != "build" && sub != "test":
		return "", false
	case out != "" && strings.HasSuffix(out, "/"):
		return filepath.Join(dir, out, "x"), true
	case out != "":
		return filepath.Join(dir, out), true
	case sub == "build" && len(pkgs) == 1 && !strings.Contains(pkgs[0], "..."):
		return filepath.Join(dir, filepath.Base(pkgs[0])), true // go build ./cmd/x writes x
	}
	return "", false
}

// TestEmbeddingDocReplace: docs/embedding.md's "Depending on it" commands,
// run in a new module that imports pushlb (the checkout's ../pushlb
// replaced by this repository), give a module that builds. go mod tidy
// reads the go.mod and sources of the tests of every dependency's
// packages, which a fresh module cache does not hold after go test
// built this module: the modules come from the cache, else from the
// environment's GOPROXY, as they would for the user.
func TestEmbeddingDocReplace(t *testing.T) {
	root := gitRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "embedding.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## Depending on it\n")
	if !ok {
		t.Fatal(`docs/embedding.md has no "Depending on it" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	stmts := shStatements(section)
	if len(stmts) == 0 {
		t.Fatal(`docs/embedding.md: "Depending on it" has no command`)
	}
	dir := t.TempDir()
	mod := "module example.com/mygateway\n\ngo 1.26\n"
	prog := "package main\n\nimport (\n\t\"fmt\"\n\n\t\"github.com/pushlb/pushlb\"\n)\n\nfunc main() { fmt.Println(pushlb.DefaultConfig().Prefix) }\n"
	for name, content := range map[string]string{"go.mod": mod, "main.go": prog} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(words ...string) {
		t.Helper()
		cmd := exec.Command(words[0], words[1:]...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOSUMDB=off", "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(words, " "), err, out)
		}
	}
	for _, st := range stmts {
		words := strings.Fields(strings.ReplaceAll(st.text, "=../pushlb", "="+root))
		if len(words) < 2 || words[0] != "go" || words[1] != "mod" {
			t.Fatalf("docs/embedding.md: %q: this test runs only go mod commands", st.text)
		}
		run(words...)
	}
	run("go", "build", "-o", filepath.Join(dir, "mygateway"), ".")
}
