package main

import (
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// bin is the testbackend binary built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(paths []string) { bin = paths[0] }, "."))
}

// lineTimeout bounds the wait for one line of output.
const lineTimeout = 5 * time.Second

// start runs testbackend with args.
func start(t *testing.T, args ...string) *testutil.Proc {
	t.Helper()
	return testutil.Start(t, bin, args...)
}

// listening waits for the listen line and returns the address.
func listening(t *testing.T, p *testutil.Proc) string {
	t.Helper()
	l := p.WaitFor(t, "listening on ", lineTimeout).Text
	return l[strings.LastIndex(l, " ")+1:]
}

func TestServesNameAndPathThenStopsOnSIGTERM(t *testing.T) {
	p := start(t, "-addr", "127.0.0.1:0", "-name", "b1", "-exit-code", "7")
	addr := listening(t, p)
	if code, body := testutil.Get(t, "http://"+addr+"/orders/42"); code != 200 || body != "b1 /orders/42\n" {
		t.Fatalf("got %d %q", code, body)
	}
	resp, err := http.Head("http://" + addr + "/orders/42")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Backend") != "b1" {
		t.Fatalf("HEAD: %d, X-Backend %q", resp.StatusCode, resp.Header.Get("X-Backend"))
	}
	if code, body := testutil.Get(t, "http://"+addr+"/health"); code != 200 || body != "ok\n" {
		t.Fatalf("health: %d %q", code, body)
	}
	p.Signal(t, syscall.SIGTERM)
	p.WaitFor(t, "b1 received terminated", lineTimeout)
	p.WaitFor(t, "b1 exiting with 7", lineTimeout)
	if code := p.Wait(t, 10*time.Second); code != 7 {
		t.Fatalf("exit status %d, want 7", code)
	}
}

func TestExitAfter(t *testing.T) {
	p := start(t, "-addr", "127.0.0.1:0", "-exit-after", "100ms", "-exit-code", "3")
	listening(t, p)
	if code := p.Wait(t, 10*time.Second); code != 3 {
		t.Fatalf("exit status %d, want 3", code)
	}
}

func TestDelayAndServingAfterSIGTERM(t *testing.T) {
	begin := time.Now()
	p := start(t, "-addr", "127.0.0.1:0", "-delay", "200ms", "-exit-on-sigterm-after", "300ms")
	p.WaitFor(t, "waiting 200ms before listening", lineTimeout)
	addr := listening(t, p)
	if d := time.Since(begin); d < 200*time.Millisecond {
		t.Fatalf("listening after %v, before -delay", d)
	}
	p.Signal(t, syscall.SIGINT)
	p.WaitFor(t, "received interrupt", lineTimeout)
	if code, _ := testutil.Get(t, "http://"+addr+"/"); code != 200 {
		t.Fatalf("not serving during -exit-on-sigterm-after: %d", code)
	}
	if code := p.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	if d := time.Since(begin); d < 500*time.Millisecond {
		t.Fatalf("exited after %v, before -delay plus -exit-on-sigterm-after", d)
	}
}

// A signal during -delay is handled, not fatal, once the waiting line is out.
func TestSignalDuringDelay(t *testing.T) {
	p := start(t, "-addr", "127.0.0.1:0", "-name", "d", "-delay", "1m", "-exit-code", "4")
	p.WaitFor(t, "d waiting 1m0s before listening", lineTimeout)
	p.Signal(t, syscall.SIGTERM)
	p.WaitFor(t, "d received terminated", lineTimeout)
	if code := p.Wait(t, 10*time.Second); code != 4 {
		t.Fatalf("exit status %d, want 4", code)
	}
}

func TestUsageAndListenErrors(t *testing.T) {
	if code := start(t).Wait(t, 10*time.Second); code != 2 {
		t.Fatalf("without -addr: %d, want 2", code)
	}
	addr := listening(t, start(t, "-addr", "127.0.0.1:0"))
	if code := start(t, "-addr", addr).Wait(t, 10*time.Second); code != 1 {
		t.Fatalf("address in use: %d, want 1", code)
	}
}
