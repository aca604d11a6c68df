package grpcexample_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// docLines returns the statements of docs/grpc.md's example block (the sh
// block after "A runnable example"), one per command, comments removed:
// "kill %2; wait %2" is two.
func docLines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "A runnable example")
	if !ok {
		t.Fatal(`docs/grpc.md: no "A runnable example" paragraph`)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatal("docs/grpc.md: no sh block after the example's paragraph")
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/grpc.md: the example's sh block does not end")
	}
	var out []string
	for line := range strings.Lines(block) {
		line, _, _ = strings.Cut(line, "#")
		for stmt := range strings.SplitSeq(line, ";") {
			if stmt = strings.TrimSpace(stmt); stmt != "" {
				out = append(out, stmt)
			}
		}
	}
	return out
}

// TestDocsCommands runs docs/grpc.md's commands as written, from the
// repository's root, as a newcomer would: the builds exactly (into a
// directory of the test's instead of bin/, with go.sum read-only), then
// the processes they built, on ports of the test's own (the gateway's
// proxy, admin and embedded NATS addresses, and announce's and the
// client's -nats, are added; the server's address is replaced). The client
// must get its answers from the announced server, and the block must stop
// every process it started, each exiting 0.
func TestDocsCommands(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	binDir := t.TempDir()
	natsAddr, serverAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	const docServerAddr = "127.0.0.1:50051"
	var jobs []*testutil.Proc // the block's background jobs: %1 is jobs[0]
	job := func(spec string) *testutil.Proc {
		n, err := strconv.Atoi(strings.TrimPrefix(spec, "%"))
		if err != nil || n < 1 || n > len(jobs) {
			t.Fatalf("docs/grpc.md: %s is not one of the %d jobs started", spec, len(jobs))
		}
		return jobs[n-1]
	}
	waitJob := func(p *testutil.Proc, what string) {
		if code := p.Wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s exited %d:\n%s", what, code, p.Output())
		}
	}
	for _, stmt := range docLines(t) {
		words := strings.Fields(stmt)
		background := words[len(words)-1] == "&"
		if background {
			words = words[:len(words)-1]
		}
		switch {
		case words[0] == "go":
			build(t, root, binDir, words)
		case words[0] == "kill":
			for _, spec := range words[1:] {
				job(spec).Signal(t, syscall.SIGTERM)
			}
		case words[0] == "wait":
			specs := words[1:]
			if len(specs) == 0 {
				for i := range jobs {
					specs = append(specs, "%"+strconv.Itoa(i+1))
				}
			}
			for _, spec := range specs {
				waitJob(job(spec), stmt+" ("+spec+")")
			}
		case strings.HasPrefix(words[0], "bin/"):
			args := []string{}
			for _, w := range words[1:] {
				switch {
				case strings.HasPrefix(w, "bin/"):
					w = filepath.Join(binDir, strings.TrimPrefix(w, "bin/"))
				case w == docServerAddr:
					w = serverAddr
				}
				args = append(args, w)
			}
			prog := strings.TrimPrefix(words[0], "bin/")
			var ready string
			switch prog {
			case "gateway":
				args = append([]string{"-listen", testutil.FreeAddr(t), "-admin", testutil.FreeAddr(t),
					"-embedded-nats", natsAddr, "-data-dir", t.TempDir()}, args...)
				ready = "gateway started"
			case "announce":
				args = append([]string{"-nats", "nats://" + natsAddr}, args...)
				ready = "announced"
			case "client":
				args = append([]string{"-nats", "nats://" + natsAddr}, args...)
			default:
				t.Fatalf("docs/grpc.md runs %s, which this test does not know how to run on its own ports", words[0])
			}
			p := testutil.Start(t, filepath.Join(binDir, prog), args...)
			if background {
				p.WaitFor(t, ready, 30*time.Second)
				jobs = append(jobs, p)
				continue
			}
			waitJob(p, stmt)
			if prog == "client" {
				checkAnswers(t, words, p.Stdout(), serverAddr)
			}
		default:
			t.Fatalf("docs/grpc.md: %q: this test does not know the command", stmt)
		}
	}
	if len(jobs) == 0 {
		t.Fatal("docs/grpc.md's block started no process")
	}
	for i, p := range jobs {
		select {
		case <-p.Done():
		default:
			t.Errorf("docs/grpc.md's block leaves job %%%d running", i+1)
		}
	}
}

// build runs one of the doc's go commands in the repository's root, its
// output directory bin/ replaced by binDir. GOFLAGS=-mod=readonly and
// GOWORK=off make it fail as a newcomer's would on a missing go.sum entry.
func build(t *testing.T, root, binDir string, words []string) {
	t.Helper()
	dir := root // where -o is relative to: the root, or -C's directory
	args := append([]string(nil), words[1:]...)
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-C":
			dir = filepath.Join(root, args[i+1])
		case "-o":
			if filepath.Join(dir, args[i+1]) != filepath.Join(root, "bin") {
				t.Fatalf("docs/grpc.md: %s builds into %s, not bin/ where its commands run", strings.Join(words, " "), args[i+1])
			}
			args[i+1] = binDir + string(filepath.Separator)
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docs/grpc.md: %s: %v\n%s", strings.Join(words, " "), err, out)
	}
}

// checkAnswers checks that the client, run with words (its -n), printed
// one answer per RPC, each from the server at addr.
func checkAnswers(t *testing.T, words []string, stdout, addr string) {
	t.Helper()
	n := 6 // the client's default
	for i, w := range words {
		if w == "-n" && i+1 < len(words) {
			var err error
			if n, err = strconv.Atoi(words[i+1]); err != nil {
				t.Fatalf("docs/grpc.md: client -n %s", words[i+1])
			}
		}
	}
	got := regexp.MustCompile(`(?m)^answered by `+regexp.QuoteMeta(addr)+`$`).FindAllString(stdout, -1)
	if len(got) != n {
		t.Fatalf("the client printed %d answers from %s, want %d:\n%s", len(got), addr, n, stdout)
	}
}
