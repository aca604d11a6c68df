// The tests of this package run the caddy binary built from this module
// as a user would: a Caddyfile, a real NATS server (in the test process),
// backends started by pushlb's announce, and HTTP load through Caddy.
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// The binaries, built once by TestMain: this caddy, pushlb's announce and
// the test backend.
var bin struct{ caddy, announce, backend string }

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(p []string) { bin.caddy, bin.announce, bin.backend = p[0], p[1], p[2] },
		".", "github.com/pushlb/pushlb/cmd/announce", "github.com/pushlb/pushlb/internal/testkit/testbackend"))
}

// lineTimeout bounds the waits for a process's log line.
const lineTimeout = 20 * time.Second

// caddyProc is a running caddy.
type caddyProc struct {
	*testutil.Proc
	dir    string
	admin  string // admin API address
	listen string // the site's address
	env    []string
}

// globals are the global options of the tests' Caddyfiles: the admin API
// on a free port, no HTTPS, no saved config.
func globals(admin string) string {
	return fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n}\n", admin)
}

// site is a Caddyfile with one site on listen whose reverse_proxy has the
// directives body.
func site(admin, listen, body string) string {
	return globals(admin) + fmt.Sprintf("http://%s {\n\tbind 127.0.0.1\n\treverse_proxy {\n%s\n\t}\n}\n", listen, body)
}

// pushlbSource is the reverse_proxy lines of a pushlb source for orders
// on natsURL in zone, plus extra lines inside its block.
func pushlbSource(natsURL, zone string, extra ...string) string {
	return fmt.Sprintf("\t\tdynamic pushlb orders {\n\t\t\tnats %s\n\t\t\tzone %s\n%s\t\t}\n", natsURL, zone, indent(extra, "\t\t\t"))
}

func indent(lines []string, prefix string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(prefix + l + "\n")
	}
	return b.String()
}

// startCaddy starts caddy with the Caddyfile made by config(admin,
// listen) on free ports, and waits until its admin API answers. Its HOME
// and XDG directories are the test's.
func startCaddy(t *testing.T, config func(admin, listen string) string, env ...string) *caddyProc {
	t.Helper()
	c := &caddyProc{dir: t.TempDir(), admin: testutil.FreeAddr(t), listen: testutil.FreeAddr(t)}
	_, port, _ := net.SplitHostPort(c.listen)
	// The example Caddyfile reads its admin address and port from the
	// environment.
	c.env = append(os.Environ(), "HOME="+c.dir, "XDG_DATA_HOME="+c.dir, "XDG_CONFIG_HOME="+c.dir,
		"CADDY_ADMIN="+c.admin, "PORT="+port, "BIND=127.0.0.1")
	c.env = append(c.env, env...)
	file := c.write(t, config(c.admin, c.listen))
	cmd := exec.Command(bin.caddy, "run", "--config", file, "--adapter", "caddyfile")
	cmd.Env = c.env
	c.Proc = testutil.StartCmd(t, cmd)
	testutil.Eventually(t, "caddy's admin API", func() bool {
		code, _, err := testutil.Fetch(nil, "http://"+c.admin+"/config/")
		return err == nil && code == 200
	})
	return c
}

var configs atomic.Int64

// write writes a Caddyfile into the caddy's directory and returns its path.
func (c *caddyProc) write(t *testing.T, content string) string {
	t.Helper()
	file := filepath.Join(c.dir, fmt.Sprintf("Caddyfile.%d", configs.Add(1)))
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// reload runs `caddy reload` with the Caddyfile config(admin, listen), and
// fails the test if it fails.
func (c *caddyProc) reload(t *testing.T, config func(admin, listen string) string) {
	t.Helper()
	file := c.write(t, config(c.admin, c.listen))
	cmd := exec.Command(bin.caddy, "reload", "--config", file, "--adapter", "caddyfile", "--address", c.admin)
	cmd.Env = c.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
}

// goroutines returns the caddy's goroutine count, from its admin API.
func (c *caddyProc) goroutines(t *testing.T) int {
	t.Helper()
	code, body, err := testutil.Fetch(nil, "http://"+c.admin+"/debug/pprof/goroutine?debug=1")
	if err != nil || code != 200 {
		t.Fatalf("goroutine profile: %d %v", code, err)
	}
	m := regexp.MustCompile(`goroutine profile: total (\d+)`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no goroutine count in %.200q", body)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// backend is one instance of a service: a testbackend under announce.
type backend struct {
	name, addr string
	announce   *testutil.Proc
}

// announceBackend starts testbackend name on a free port under announce
// for service in zone, and waits until it is announced.
func announceBackend(t *testing.T, natsURL, service, zone, name string, flags ...string) *backend {
	t.Helper()
	b := &backend{name: name, addr: testutil.FreeAddr(t)}
	args := append([]string{"-nats", natsURL, "-service", service, "-addr", b.addr, "-zone", zone}, flags...)
	args = append(args, "--", bin.backend, "-addr", b.addr, "-name", name)
	b.announce = testutil.Start(t, bin.announce, args...)
	b.announce.WaitFor(t, "announced online", lineTimeout)
	return b
}

// client is an HTTP client for requests through caddy, its idle
// connections closed at cleanup.
func client(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// answeredBy sends GET url and returns the X-Backend of the answer, or
// an error for anything but a 200.
func answeredBy(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	buf := make([]byte, 512)
	n, _ := resp.Body.Read(buf)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %.100q", resp.Status, buf[:n])
	}
	return resp.Header.Get("X-Backend"), nil
}

// load sends GET requests through caddy from several goroutines until
// stopped, and records the answers: failures, and when each backend
// answered first and last.
type load struct {
	url  string
	http *http.Client
	stop chan struct{}
	wg   sync.WaitGroup

	// retryEOF retries, once, a request whose connection closed before
	// any answer (closedBeforeAnswer), as an idempotent client would, and
	// counts it: Caddy's reload can close a connection it just accepted.
	retryEOF bool

	mu      sync.Mutex
	ok      int
	retried int
	failed  []string
	first   map[string]time.Time
	last    map[string]time.Time
	count   map[string]int
}

// startLoad starts workers goroutines of requests to url.
func startLoad(t *testing.T, url string, workers int) *load {
	return startLoadWith(t, url, workers, false)
}

// startLoadWith is startLoad, retrying requests whose connection closed
// before any answer when retryEOF is set (see load.retryEOF).
func startLoadWith(t *testing.T, url string, workers int, retryEOF bool) *load {
	l := &load{url: url, http: client(t), stop: make(chan struct{}), first: map[string]time.Time{}, last: map[string]time.Time{}, count: map[string]int{}, retryEOF: retryEOF}
	for range workers {
		l.wg.Add(1)
		go l.run()
	}
	t.Cleanup(l.end)
	return l
}

func (l *load) run() {
	defer l.wg.Done()
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		name, err := answeredBy(l.http, l.url)
		retried := false
		if err != nil && l.retryEOF && closedBeforeAnswer(err) {
			retried = true
			name, err = answeredBy(l.http, l.url)
		}
		now := time.Now()
		l.mu.Lock()
		if retried {
			l.retried++
		}
		if err != nil {
			l.failed = append(l.failed, now.Format("15:04:05.000000")+" "+err.Error())
		} else {
			l.ok++
			if _, seen := l.first[name]; !seen {
				l.first[name] = now
			}
			l.last[name] = now
			l.count[name]++
		}
		l.mu.Unlock()
	}
}

// closedBeforeAnswer reports whether err says the connection closed
// before any answer: io.EOF, or a reset when the closing side still held
// the request unread (its kernel then answers with RST).
func closedBeforeAnswer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// retriedCount returns how many requests were retried (see retryEOF).
func (l *load) retriedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.retried
}

// end stops the load and waits for its requests; idempotent.
func (l *load) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// answers returns the number of successful answers so far.
func (l *load) answers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok
}

// firstAnswer returns when backend name first answered, if it did.
func (l *load) firstAnswer(name string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.first[name]
	return at, ok
}

// counts returns a copy of the answers per backend, and resets them.
func (l *load) takeCounts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.count
	l.count = map[string]int{}
	return c
}

// failures returns the failed requests.
func (l *load) failures() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.failed...)
}

// counting is a TCP listener that counts the connections it accepts and
// closes each at once: an instance that is listed but broken (a transport
// error for every request sent to it).
type counting struct {
	ln       net.Listener
	accepted atomic.Int64
	done     chan struct{}
}

func brokenListener(t *testing.T) *counting {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &counting{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.accepted.Add(1)
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-c.done })
	return c
}

func (c *counting) addr() string { return c.ln.Addr().String() }
