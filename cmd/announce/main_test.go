package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/natstest"
	"github.com/pushlb/pushlb/internal/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// The binaries under test, built once by TestMain.
var announceBin, backendBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "announce-test")
	if err != nil {
		panic(err)
	}
	announceBin = filepath.Join(dir, "announce")
	backendBin = filepath.Join(dir, "testbackend")
	// One go build for both: -o with a directory writes each command there.
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), ".", "../../internal/testbackend")
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		panic("go build: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	if code == 0 {
		// The processes are gone; what this process started (NATS servers,
		// clients, watchers) must be gone too.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// --- the NATS side: events and registry -------------------------------

// seen is an event and when the test received it.
type seen struct {
	events.Event
	at time.Time
}

// world is a NATS server with a subscriber on lb.svc.> and the registry.
type world struct {
	srv *natstest.Server
	reg *serverlist.Registry
	evs chan seen
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldWith(t, natstest.Start(t))
}

func newWorldWith(t *testing.T, srv *natstest.Server) *world {
	t.Helper()
	w := &world{srv: srv, evs: make(chan seen, 32)}
	nc := w.srv.Connect(t)
	if _, err := nc.Subscribe(events.WildcardSubject(events.DefaultPrefix), func(m *nats.Msg) {
		e, err := events.DecodeMessage(events.DefaultPrefix, m.Subject, m.Data)
		if err != nil {
			t.Errorf("bad event on %s: %v", m.Subject, err)
			return
		}
		w.evs <- seen{Event: e, at: time.Now()}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The same TTL as announce's default -lease: Open updates the bucket.
	w.reg, err = serverlist.Open(testCtx(t), js, serverlist.RegistryConfig{TTL: serverlist.DefaultTTL})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// next returns the next event, failing after 5 s.
func (w *world) next(t *testing.T) seen {
	t.Helper()
	select {
	case e := <-w.evs:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return seen{}
}

// quiet fails if an event arrives within d.
func (w *world) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case e := <-w.evs:
		t.Fatalf("unexpected event %+v", e.Event)
	case <-time.After(d):
	}
}

// get reads an instance from the registry; ok is false when it is absent.
func (w *world) get(t *testing.T, service, id string) (serverlist.Instance, bool) {
	t.Helper()
	in, err := w.reg.Get(testCtx(t), service, id)
	if errors.Is(err, serverlist.ErrNotFound) {
		return in, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return in, true
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// --- processes ----------------------------------------------------------

// line is one line of a process's stdout and when the test read it.
type line struct {
	text string
	at   time.Time
}

// proc is a running binary: stdout arrives line by line, stderr is kept.
type proc struct {
	cmd    *exec.Cmd
	lines  chan line
	stderr testutil.SyncBuffer
	done   chan struct{} // closed after Wait
	status int
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), lines: make(chan line, 64), done: make(chan struct{})}
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- line{text: sc.Text(), at: time.Now()}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = p.cmd.Wait()
		p.status = p.cmd.ProcessState.ExitCode()
		close(p.lines)
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() || testing.Verbose() {
			t.Logf("%s %s stderr:\n%s", filepath.Base(bin), strings.Join(args, " "), p.stderr.String())
		}
	})
	return p
}

func announce(t *testing.T, args ...string) *proc { return start(t, announceBin, args...) }

// wait waits for the process to exit and returns its exit status.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.status
	case <-time.After(10 * time.Second):
		t.Fatal("process did not exit within 10s")
	}
	return -1
}

// line waits for a stdout line containing want.
func (p *proc) line(t *testing.T, want string) line {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("stdout closed before a line with %q", want)
			}
			if strings.Contains(l.text, want) {
				return l
			}
		case <-timeout:
			t.Fatalf("no stdout line with %q within 5s", want)
		}
	}
}

// noLine fails if a stdout line containing want has already arrived.
func (p *proc) noLine(t *testing.T, want string) {
	t.Helper()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return
			}
			if strings.Contains(l.text, want) {
				t.Fatalf("unexpected stdout line %q", l.text)
			}
		default:
			return
		}
	}
}

func (p *proc) signal(t *testing.T, s os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatal(err)
	}
}

// freeAddr returns 127.0.0.1:PORT with nothing listening on PORT.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func expectKind(t *testing.T, e seen, k events.Kind, id string) {
	t.Helper()
	if e.Kind != k || e.Service != "orders" || e.InstanceID != id {
		t.Fatalf("got %+v, want %v of orders/%s", e.Event, k, id)
	}
}

// newWorldOn is newWorld with the NATS server on a chosen port.
func newWorldOn(t *testing.T, port int) *world {
	t.Helper()
	return newWorldWith(t, natstest.Start(t, func(o *server.Options) { o.Port = port }))
}
