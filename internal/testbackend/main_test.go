package main

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bin is the testbackend binary built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "testbackend")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "testbackend")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		panic("go build: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running testbackend whose stdout lines arrive on a channel.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	addr  string
}

func start(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// line returns the next stdout line containing want.
func (p *proc) line(t *testing.T, want string) string {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("stdout closed before a line with %q", want)
			}
			if strings.Contains(l, want) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line with %q", want)
		}
	}
}

// listening waits for the listen line and records the address.
func (p *proc) listening(t *testing.T) {
	t.Helper()
	l := p.line(t, "listening on ")
	p.addr = l[strings.LastIndex(l, " ")+1:]
}

// wait waits for the process to exit and returns its status.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(10 * time.Second):
		t.Fatal("process did not exit")
	}
	return -1
}

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body), resp.Header
}

func TestServesNameAndPathThenStopsOnSIGTERM(t *testing.T) {
	p := start(t, "-addr", "127.0.0.1:0", "-name", "b1", "-exit-code", "7")
	p.listening(t)
	code, body, h := get(t, "http://"+p.addr+"/orders/42")
	if code != 200 || body != "b1 /orders/42\n" || h.Get("X-Backend") != "b1" {
		t.Fatalf("got %d %q %v", code, body, h)
	}
	if code, body, _ := get(t, "http://"+p.addr+"/health"); code != 200 || body != "ok\n" {
		t.Fatalf("health: %d %q", code, body)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.line(t, "b1 received terminated")
	p.line(t, "b1 exiting with 7")
	if code := p.wait(t); code != 7 {
		t.Fatalf("exit status %d, want 7", code)
	}
}

func TestExitAfter(t *testing.T) {
	p := start(t, "-addr", "127.0.0.1:0", "-exit-after", "100ms", "-exit-code", "3")
	p.listening(t)
	if code := p.wait(t); code != 3 {
		t.Fatalf("exit status %d, want 3", code)
	}
}

func TestDelayAndServingAfterSIGTERM(t *testing.T) {
	begin := time.Now()
	p := start(t, "-addr", "127.0.0.1:0", "-delay", "200ms", "-exit-on-sigterm-after", "300ms")
	p.listening(t)
	if d := time.Since(begin); d < 200*time.Millisecond {
		t.Fatalf("listening after %v, before -delay", d)
	}
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	p.line(t, "received interrupt")
	if code, _, _ := get(t, "http://"+p.addr+"/"); code != 200 {
		t.Fatalf("not serving during -exit-on-sigterm-after: %d", code)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	if d := time.Since(begin); d < 500*time.Millisecond {
		t.Fatalf("exited after %v, before -delay plus -exit-on-sigterm-after", d)
	}
}

func TestUsageAndListenErrors(t *testing.T) {
	if code := start(t).wait(t); code != 2 {
		t.Fatalf("without -addr: %d, want 2", code)
	}
	p := start(t, "-addr", "127.0.0.1:0")
	p.listening(t)
	if code := start(t, "-addr", p.addr).wait(t); code != 1 {
		t.Fatalf("address in use: %d, want 1", code)
	}
}
