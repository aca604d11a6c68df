package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// outputGrace is how long Wait waits, after the process exited, for
	// its output to end: a child it left behind may hold the pipes open.
	// Then the pipes are closed and what was read so far is kept.
	outputGrace = 2 * time.Second
	// killTimeout bounds the wait for a SIGKILLed process to be reaped.
	killTimeout = 10 * time.Second
	// maxLogged bounds the output logged for a failed test: its end.
	maxLogged = 256 << 10
)

// Stream names the output a line came from.
type Stream int

// The streams of a Proc.
const (
	Stdout Stream = iota + 1
	Stderr
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return fmt.Sprintf("Stream(%d)", int(s))
}

// Line is one line of a process's output, without its line ending.
type Line struct {
	Stream Stream
	Text   string
	At     time.Time // when the test read it
}

// Proc is a process started by Start or StartCmd. Its stdout and stderr are
// kept whole and line by line; the methods that wait are bounded by a
// timeout and fail the test when it passes. Its methods are safe for
// concurrent use, but WaitFor and WaitForRegexp share one position per
// stream, so one goroutine at a time should wait for lines.
//
// A Proc never outlives its test: the test's cleanup SIGKILLs it if it
// still runs, waits for it, and logs its output when the test failed. The
// processes it started itself are its own to stop (announce's command gets
// SIGTERM from the kernel when announce dies); one left holding the output
// open delays the end of the Proc by cmd.WaitDelay at most.
type Proc struct {
	cmd  *exec.Cmd
	name string // binary and arguments, for messages

	mu      sync.Mutex
	stdout  streamWriter
	stderr  streamWriter
	output  bytes.Buffer // both streams as they came
	lines   []Line
	next    [Stderr + 1]int // per stream: index in lines after the last match
	changed chan struct{}   // closed and replaced when lines grows or output ends
	ended   bool            // all output is in

	done    chan struct{} // closed once the process was reaped and its output ended
	state   *os.ProcessState
	waitErr error
}

// Start starts the binary at path with args, in the test's environment and
// working directory. It fails the test if the binary cannot start.
func Start(tb testing.TB, path string, args ...string) *Proc {
	tb.Helper()
	return StartCmd(tb, exec.Command(path, args...))
}

// StartCmd starts cmd, which the caller set up (Env, Dir, SysProcAttr...),
// except Stdout and Stderr, which must be nil: the Proc reads them. A zero
// cmd.WaitDelay becomes 2 s, the time the Proc waits for the output to end
// after the process exited. It fails the test if cmd cannot start.
func StartCmd(tb testing.TB, cmd *exec.Cmd) *Proc {
	tb.Helper()
	if cmd.Stdout != nil || cmd.Stderr != nil {
		tb.Fatal("testutil.StartCmd: cmd.Stdout and cmd.Stderr must be nil")
	}
	p := &Proc{cmd: cmd, changed: make(chan struct{}), done: make(chan struct{})}
	p.name = strings.Join(append([]string{filepath.Base(cmd.Path)}, cmd.Args[1:]...), " ")
	p.stdout = streamWriter{p: p, stream: Stdout}
	p.stderr = streamWriter{p: p, stream: Stderr}
	cmd.Stdout, cmd.Stderr = &p.stdout, &p.stderr
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = outputGrace
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", p.name, err)
	}
	go p.reap()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill() // os.ErrProcessDone when it already ended
		select {
		case <-p.done:
		case <-time.After(killTimeout):
			tb.Errorf("%s: not reaped %v after SIGKILL", p.name, killTimeout)
		}
		if tb.Failed() {
			out := p.Output()
			if len(out) > maxLogged {
				out = "[...]" + out[len(out)-maxLogged:]
			}
			tb.Logf("%s (%s) output:\n%s", p.name, p.status(), out)
		}
	})
	return p
}

// reap waits for the process and the end of its output.
func (p *Proc) reap() {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.state, p.waitErr = p.cmd.ProcessState, err
	p.stdout.flushLocked()
	p.stderr.flushLocked()
	p.ended = true
	p.notifyLocked()
	p.mu.Unlock()
	close(p.done)
}

// notifyLocked wakes the goroutines waiting for a line.
func (p *Proc) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// streamWriter receives one stream from os/exec's copying goroutine.
type streamWriter struct {
	p       *Proc
	stream  Stream
	raw     bytes.Buffer
	partial []byte // the start of a line whose end has not come yet
}

func (w *streamWriter) Write(b []byte) (int, error) {
	now := time.Now()
	p := w.p
	p.mu.Lock()
	defer p.mu.Unlock()
	w.raw.Write(b)
	p.output.Write(b)
	w.partial = append(w.partial, b...)
	added := false
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.addLocked(w.partial[:i], now)
		w.partial = w.partial[i+1:]
		added = true
	}
	w.partial = append([]byte(nil), w.partial...) // let the consumed bytes go
	if added {
		p.notifyLocked()
	}
	return len(b), nil
}

func (w *streamWriter) addLocked(b []byte, at time.Time) {
	w.p.lines = append(w.p.lines, Line{Stream: w.stream, Text: string(bytes.TrimSuffix(b, []byte("\r"))), At: at})
}

// flushLocked makes an unterminated last line a line.
func (w *streamWriter) flushLocked() {
	if len(w.partial) > 0 {
		w.addLocked(w.partial, time.Now())
		w.partial = nil
	}
}

// WaitFor waits for a line of stdout or stderr that contains substr and
// returns it. It looks at the lines after the one an earlier WaitFor or
// WaitForRegexp matched on the same stream, so successive calls find
// successive lines. It fails the test when no such line comes within
// timeout, or when the output ends without one.
func (p *Proc) WaitFor(tb testing.TB, substr string, timeout time.Duration) Line {
	tb.Helper()
	l, _ := p.waitLine(tb, timeout, fmt.Sprintf("a line containing %q", substr), func(s string) []string {
		if strings.Contains(s, substr) {
			return []string{s}
		}
		return nil
	})
	return l
}

// WaitForRegexp is WaitFor for a line that re matches; it also returns the
// match and its submatches, as re.FindStringSubmatch does.
func (p *Proc) WaitForRegexp(tb testing.TB, re *regexp.Regexp, timeout time.Duration) (Line, []string) {
	tb.Helper()
	return p.waitLine(tb, timeout, fmt.Sprintf("a line matching %q", re), re.FindStringSubmatch)
}

func (p *Proc) waitLine(tb testing.TB, timeout time.Duration, what string, match func(string) []string) (Line, []string) {
	tb.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	p.mu.Lock()
	i := min(p.next[Stdout], p.next[Stderr])
	for {
		for ; i < len(p.lines); i++ {
			l := p.lines[i]
			if i < p.next[l.Stream] {
				continue
			}
			if m := match(l.Text); m != nil {
				p.next[l.Stream] = i + 1
				p.mu.Unlock()
				return l, m
			}
		}
		// The state is read with ended: Done closes a moment after.
		ended, changed, state := p.ended, p.changed, p.state
		p.mu.Unlock()
		if ended {
			tb.Fatalf("%s: output ended (%s) before %s", p.name, describe(state), what)
		}
		select {
		case <-changed:
		case <-timer.C:
			tb.Fatalf("%s: no %s within %v", p.name, what, timeout)
		}
		p.mu.Lock()
	}
}

// Lines returns the lines read so far, of both streams, in the order they
// came.
func (p *Proc) Lines() []Line {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Line(nil), p.lines...)
}

// Stdout returns what the process wrote to stdout so far.
func (p *Proc) Stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.raw.String()
}

// Stderr returns what the process wrote to stderr so far.
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.raw.String()
}

// Output returns what the process wrote to stdout and stderr so far,
// interleaved as it was read.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// Pid returns the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process; it fails the test if that fails (the
// process was reaped already, for one).
func (p *Proc) Signal(tb testing.TB, sig os.Signal) {
	tb.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// Done is closed once the process exited and its output ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit code, -1 if a
// signal killed it. It fails the test when the process still runs after
// timeout.
func (p *Proc) Wait(tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.state.ExitCode()
	case <-t.C:
		tb.Fatalf("%s: still running after %v", p.name, timeout)
	}
	return -1
}

// Stop sends SIGTERM and returns Wait's exit code.
func (p *Proc) Stop(tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	p.Signal(tb, syscall.SIGTERM)
	return p.Wait(tb, timeout)
}

// Kill SIGKILLs the process, a crash, and waits until it is reaped.
func (p *Proc) Kill(tb testing.TB) {
	tb.Helper()
	_ = p.cmd.Process.Kill() // os.ErrProcessDone when it already ended
	p.Wait(tb, killTimeout)
}

// ExitCode returns the exit code once Done is closed (-1 if a signal
// killed the process), and -1 before.
func (p *Proc) ExitCode() int {
	if s := p.State(); s != nil {
		return s.ExitCode()
	}
	return -1
}

// State returns the process's state once Done is closed, for the signal
// that killed it or its resource use, and nil before.
func (p *Proc) State() *os.ProcessState {
	select {
	case <-p.done:
		return p.state
	default:
		return nil
	}
}

// status describes how the process ended, for messages.
func (p *Proc) status() string { return describe(p.State()) }

// describe says how a process ended, "running" for a nil state.
func describe(st *os.ProcessState) string {
	if st == nil {
		return "running"
	}
	return st.String()
}
