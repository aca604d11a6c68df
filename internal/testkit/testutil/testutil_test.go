package testutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// helperEnv selects what the test binary does when re-executed as the
// helper process of the runner's tests.
const helperEnv = "TESTUTIL_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helper(mode))
	}
	goleak.VerifyTestMain(m)
}

// helper is the helper process: the test binary re-executed with helperEnv.
func helper(mode string) int {
	switch mode {
	case "lines":
		fmt.Println("hello stdout")
		fmt.Fprintln(os.Stderr, "hello stderr")
		fmt.Println(strings.Repeat("x", 100_000)) // longer than a bufio.Scanner's limit
		fmt.Println("port=4321")
		for i := range 3 {
			fmt.Printf("n %d\n", i)
		}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM)
		fmt.Fprintln(os.Stderr, "signal handlers installed")
		fmt.Printf("got %v\n", <-sigs)
		fmt.Print("no newline at the end")
		return 3
	case "env":
		fmt.Println("value=" + os.Getenv("TESTUTIL_VALUE"))
		return 0
	case "block":
		fmt.Println("blocking")
		select {}
	case "orphan":
		// A child that inherits stdout and outlives this process.
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=block")
		cmd.Stdout = os.Stdout
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("child %d\n", cmd.Process.Pid)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}

// startHelper runs the helper process in mode.
func startHelper(tb testing.TB, mode string, env ...string) *Proc {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// GORACE: under -race, a process otherwise sleeps 1 s before it exits.
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode, "GORACE=atexit_sleep_ms=0"), env...)
	return StartCmd(tb, cmd)
}

func TestProcLinesSignalsAndExit(t *testing.T) {
	p := startHelper(t, "lines")
	began := time.Now()
	if l := p.WaitFor(t, "hello stdout", 5*time.Second); l.Stream != Stdout || l.Text != "hello stdout" || l.At.Before(began) {
		t.Fatalf("got %+v", l)
	}
	if l := p.WaitFor(t, "hello", 5*time.Second); l.Stream != Stderr || l.Text != "hello stderr" {
		t.Fatalf("the stderr line: got %+v", l)
	}
	if l := p.WaitFor(t, "xxxx", 5*time.Second); len(l.Text) != 100_000 {
		t.Fatalf("the long line has %d bytes", len(l.Text))
	}
	if _, m := p.WaitForRegexp(t, regexp.MustCompile(`^port=(\d+)$`), 5*time.Second); len(m) != 2 || m[1] != "4321" {
		t.Fatalf("submatches %q", m)
	}
	// Successive waits find successive lines.
	for i := range 3 {
		if l := p.WaitFor(t, "n ", 5*time.Second); l.Text != fmt.Sprintf("n %d", i) {
			t.Fatalf("wait %d: %q", i, l.Text)
		}
	}
	p.WaitFor(t, "signal handlers installed", 5*time.Second)
	if p.ExitCode() != -1 || p.State() != nil {
		t.Fatal("exit code or state before the exit")
	}
	p.Signal(t, syscall.SIGTERM)
	p.WaitFor(t, "got terminated", 5*time.Second)
	p.WaitFor(t, "no newline at the end", 5*time.Second)
	if code := p.Wait(t, 5*time.Second); code != 3 || p.ExitCode() != 3 {
		t.Fatalf("exit code %d", code)
	}
	if !strings.HasPrefix(p.Stdout(), "hello stdout\nxxx") || !strings.HasSuffix(p.Stdout(), "got terminated\nno newline at the end") {
		t.Fatalf("stdout %.40q...", p.Stdout())
	}
	if p.Stderr() != "hello stderr\nsignal handlers installed\n" {
		t.Fatalf("stderr %q", p.Stderr())
	}
	if n := len(p.Lines()); n != 10 {
		t.Fatalf("%d lines, want 10", n)
	}
	if out := p.Output(); !strings.Contains(out, "hello stderr\n") || !strings.Contains(out, "hello stdout\n") {
		t.Fatalf("output %.80q", out)
	}
}

func TestStartCmdKeepsEnv(t *testing.T) {
	p := startHelper(t, "env", "TESTUTIL_VALUE=42")
	p.WaitFor(t, "value=42", 5*time.Second)
	if code := p.Wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

func TestStopAndKill(t *testing.T) {
	p := startHelper(t, "block")
	p.WaitFor(t, "blocking", 5*time.Second)
	if code := p.Stop(t, 5*time.Second); code != -1 {
		t.Fatalf("exit code %d after SIGTERM, want -1", code)
	}
	if ws, ok := p.State().Sys().(syscall.WaitStatus); ok && ws.Signal() != syscall.SIGTERM {
		t.Fatalf("state %v", p.State())
	}
	k := startHelper(t, "block")
	k.WaitFor(t, "blocking", 5*time.Second)
	k.Kill(t)
	if ws, ok := k.State().Sys().(syscall.WaitStatus); ok && ws.Signal() != syscall.SIGKILL {
		t.Fatalf("state %v", k.State())
	}
}

// A child that keeps the output open must not keep Wait waiting.
func TestWaitDespiteAChildHoldingTheOutput(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=orphan", "GORACE=atexit_sleep_ms=0")
	cmd.WaitDelay = 100 * time.Millisecond
	p := StartCmd(t, cmd)
	_, m := p.WaitForRegexp(t, regexp.MustCompile(`^child (\d+)$`), 5*time.Second)
	pid, _ := strconv.Atoi(m[1])
	defer func() {
		if c, err := os.FindProcess(pid); err == nil {
			c.Kill()
			c.Wait() // not our child: an error, but the kill was sent
		}
	}()
	if code := p.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	// Wait returned while the child, which never closes the output, still
	// runs: it did not wait for the output to end.
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the child holding the output is gone (%v): the test proves nothing", err)
	}
}

// fakeTB records failures; Fatal ends the goroutine as testing's does.
type fakeTB struct {
	testing.TB // nil: the methods below are the only ones used
	mu         sync.Mutex
	msgs       []string
	failed     bool
	cleanups   []func()
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Logf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, "log: "+fmt.Sprintf(format, args...))
}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = true
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Fatalf(format string, args ...any) { f.Errorf(format, args...); runtime.Goexit() }
func (f *fakeTB) Fatal(args ...any)                 { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

// runFake runs fn as a test body with a fakeTB, then its cleanups, and
// returns the messages.
func runFake(fn func(tb testing.TB)) (failed bool, msgs string) {
	f := &fakeTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f.failed, strings.Join(f.msgs, "\n")
}

func TestFailuresAreBoundedAndCleanupKills(t *testing.T) {
	var p *Proc
	failed, msgs := runFake(func(tb testing.TB) {
		p = startHelper(tb, "block")
		p.WaitFor(tb, "blocking", 5*time.Second)
		p.WaitFor(tb, "never", 20*time.Millisecond)
		t.Error("WaitFor returned")
	})
	if !failed || !strings.Contains(msgs, `no a line containing "never" within 20ms`) || !strings.Contains(msgs, "blocking") {
		t.Fatalf("failed %v, messages:\n%s", failed, msgs)
	}
	if p.State() == nil {
		t.Fatal("the cleanup did not reap the process")
	}

	failed, msgs = runFake(func(tb testing.TB) {
		p := startHelper(tb, "env")
		p.WaitFor(tb, "never", time.Minute)
	})
	if !failed || !strings.Contains(msgs, "output ended (exit status 0) before") {
		t.Fatalf("failed %v, messages:\n%s", failed, msgs)
	}

	failed, msgs = runFake(func(tb testing.TB) {
		startHelper(tb, "block").Wait(tb, 10*time.Millisecond)
	})
	if !failed || !strings.Contains(msgs, "still running after 10ms") {
		t.Fatalf("failed %v, messages:\n%s", failed, msgs)
	}

	failed, msgs = runFake(func(tb testing.TB) { Start(tb, "/nonexistent/binary") })
	if !failed || !strings.Contains(msgs, "start binary") {
		t.Fatalf("failed %v, messages:\n%s", failed, msgs)
	}
}

func TestEventually(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() { fmt.Fprintf(&b, "%d;", i) })
	}
	Eventually(t, "ten writes", func() bool { wg.Wait(); return len(b.String()) == 20 })

	n := 0
	EventuallyWithin(t, time.Second, "three polls", func() bool { n++; return n == 3 })
	failed, msgs := runFake(func(tb testing.TB) {
		EventuallyWithin(tb, 10*time.Millisecond, "never", func() bool { return false })
	})
	if !failed || msgs != "timed out after 10ms waiting for never" {
		t.Fatalf("failed %v: %s", failed, msgs)
	}
}

func TestReceive(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if v := Receive(t, ch, time.Second, "seven"); v != 7 {
		t.Fatal(v)
	}
	closed := make(chan struct{})
	close(closed)
	Receive(t, closed, time.Second, "the close")
	failed, msgs := runFake(func(tb testing.TB) { Receive(tb, ch, 10*time.Millisecond, "nothing") })
	if !failed || msgs != "timed out after 10ms waiting for nothing" {
		t.Fatalf("failed %v: %s", failed, msgs)
	}
}

func TestFreePort(t *testing.T) {
	addr := FreeAddr(t)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))))
	if err != nil {
		t.Fatal(err)
	}
	u.Close()
}

// TestFreePortReserved: on Linux a port comes from below the kernel's
// ephemeral range, which the kernel never hands to a port-0 bind or an
// outgoing connection, and no other test (this process or another) gets it
// until its test ends.
func TestFreePortReserved(t *testing.T) {
	first, ok := ephemeralStart()
	if !ok {
		t.Skip("the kernel's ephemeral range is unknown here: ports come from the kernel")
	}
	dir := portLockDir()
	var port int
	t.Run("hold", func(t *testing.T) {
		port = FreePort(t)
		if port < reservedLow || port >= first {
			t.Fatalf("port %d, want one in [%d, %d)", port, reservedLow, first)
		}
		if _, err := lockPort(dir, port); !errors.Is(err, errPortLocked) {
			t.Fatalf("port %d's lock taken again while its test runs: %v", port, err)
		}
		seen := map[int]bool{port: true}
		for range 50 {
			p := FreePort(t)
			if seen[p] {
				t.Fatalf("port %d handed out twice in one test", p)
			}
			seen[p] = true
		}
	})
	release, err := lockPort(dir, port)
	if err != nil {
		t.Fatalf("port %d still reserved after its test ended: %v", port, err)
	}
	release()
}

func TestBuildBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	paths, remove, err := BuildBinaries("./testdata/echoargs")
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	if len(paths) != 1 || !strings.HasSuffix(strings.TrimSuffix(paths[0], ".exe"), "echoargs") {
		t.Fatalf("paths %v", paths)
	}
	p := Start(t, paths[0], "a b", "c")
	if code := p.Wait(t, 10*time.Second); code != 0 || p.Stdout() != "a b\nc\n" {
		t.Fatalf("exit code %d, stdout %q", code, p.Stdout())
	}
	if _, _, err := BuildBinaries("./testdata/nonexistent"); err == nil {
		t.Fatal("no error for a missing package")
	}
	if _, _, err := BuildBinaries("./testdata/echoargs", "github.com/x/echoargs"); err == nil || !strings.Contains(err.Error(), "both build") {
		t.Fatalf("two binaries of one name: %v", err)
	}
}

// TestLazyBinaries: built on the first Paths, the same paths after it,
// removed by Remove.
func TestLazyBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	l := NewLazyBinaries("./testdata/echoargs")
	first := l.Paths(t)
	if again := l.Paths(t); len(first) != 1 || again[0] != first[0] {
		t.Fatalf("paths %v, then %v", first, again)
	}
	if _, err := os.Stat(first[0]); err != nil {
		t.Fatal(err)
	}
	l.Remove()
	if _, err := os.Stat(first[0]); !os.IsNotExist(err) {
		t.Fatalf("after Remove: %v", err)
	}
	NewLazyBinaries("./testdata/echoargs").Remove() // never built: nothing to remove
}

// TestBinaryNameSkipsTheMajorVersion: go build names a module's binary
// after the element before its major version suffix.
func TestBinaryNameSkipsTheMajorVersion(t *testing.T) {
	for pkg, want := range map[string]string{
		"github.com/nats-io/nats-server/v2": "nats-server",
		"github.com/x/tool/cmd/v2ray":       "v2ray",
		"example.com/v3/cmd/gw":             "gw",
		"v2":                                "v2",
	} {
		if got, err := binaryName(pkg); err != nil || got != want {
			t.Errorf("binaryName(%q) = %q, %v; want %q", pkg, got, err, want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	if p50, p99, p100 := Percentile(d, 0.5), Percentile(d, 0.99), Percentile(d, 1); p50 != 50 || p99 != 99 || p100 != 100 {
		t.Fatalf("p50 %v p99 %v p100 %v", p50, p99, p100)
	}
	for i := 1; i <= 100; i++ {
		if got := Percentile(d, float64(i)/100); got != time.Duration(i) {
			t.Fatalf("p%d = %v", i, got)
		}
	}
	if d[0] != 100 {
		t.Fatal("Percentile sorted its input")
	}
	if Percentile(nil, 0.5) != 0 || Percentile([]time.Duration{7}, 0.01) != 7 {
		t.Fatal("empty or one-element input")
	}
}

// recordingTB records how a helper ended a test.
type recordingTB struct {
	testing.TB
	failed, skipped string
}

func (r *recordingTB) Helper()                   {}
func (r *recordingTB) Fatalf(f string, a ...any) { r.failed = fmt.Sprintf(f, a...) }
func (r *recordingTB) Skip(a ...any)             { r.skipped = fmt.Sprint(a...) }

// TestMissingFailsUnderCI: a missing component fails the test under
// CI=true and skips it elsewhere.
func TestMissingFailsUnderCI(t *testing.T) {
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		r := &recordingTB{TB: t}
		Missing(r, "no %s", "chromium")
		if ci == "true" && (r.failed == "" || !strings.Contains(r.failed, "no chromium") || r.skipped != "") {
			t.Errorf("CI=true: failed %q, skipped %q; want a failure naming the component", r.failed, r.skipped)
		}
		if ci == "" && (r.skipped != "no chromium" || r.failed != "") {
			t.Errorf("no CI: failed %q, skipped %q; want a skip", r.failed, r.skipped)
		}
	}
}
