package subscriber_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/subscriber"
)

// TestAdvisoryOfANewConnectionWhileTheOldOnesProbeRuns: an instance's
// connection ends (a withdrawal whose advisory beat the record's removal
// to the mirror, a blip) and its probe runs; meanwhile the instance
// announces again under the same ID on a new connection, and crashes:
// the new connection's advisory gets a probe of its own, which removes
// the instance at once. The old probe's verdict, whatever it is, is about
// the old record's revision and removes nothing: skipping the new probe
// because one of the same instance ran left the crash to the lease
// (BenchmarkRegionFailover's first crash, 30 s, after a graceful
// withdrawal of the same ID a few milliseconds before).
//
// The old probe is held in flight for as long as the test runs by the
// record's address, a listener whose accept queue is full: its connect
// hangs until the probe timeout (a minute), or until Close.
func TestAdvisoryOfANewConnectionWhileTheOldOnesProbeRuns(t *testing.T) {
	r := newAdvisoryRigWith(t, subscriber.Config{ProbeTimeout: time.Minute})
	reg := openRegistry(t, r.srv.Connect(t))

	// The first announce: its record names conn1 and an address whose
	// connects hang.
	conn1 := r.srv.Connect(t)
	in := instance("orders", 1, time.Now().UnixNano())
	in.Host, in.Port = hangingListener(t)
	in.NATSServerID, in.NATSClientID = connectionOf(t, conn1)
	if _, err := reg.Register(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	r.g.waitMirrored(t, in)
	conn1.Close()
	testutil.Eventually(t, "the first connection's probe to start", func() bool { return r.g.sub.Stats().Advisories.Matched == 1 })

	// The second announce of the ID: a new process (incarnation), a new
	// connection, an address where nothing listens once it crashed.
	conn2 := r.srv.Connect(t)
	next := in
	next.Incarnation++
	dead := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	next.Port = dead.Listener.Addr().(*net.TCPAddr).Port
	dead.Close()
	next.NATSServerID, next.NATSClientID = connectionOf(t, conn2)
	if _, err := reg.Register(t.Context(), next); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the mirror to hold the second record", func() bool {
		return r.connection(next) == next.Connection()
	})

	// Its crash. Received counts an advisory once it is handled (its
	// probe started or skipped).
	received := r.g.sub.Stats().Advisories.Received
	conn2.Close()
	testutil.Eventually(t, "the second connection's advisory handled", func() bool {
		return r.g.sub.Stats().Advisories.Received > received
	})
	if a := r.g.sub.Stats().Advisories; a.Matched != 2 || a.Skipped != 0 {
		t.Fatalf("advisory stats %+v, want two matches, none skipped: the crash's probe did not run", a)
	}
	r.g.waitCause(t, "orders", in.InstanceID, events.CauseAdvisory)
	a := r.g.sub.Stats().Advisories
	if a.Removals != 1 || a.Probes["refused"] != 1 {
		t.Fatalf("advisory stats %+v, want one refused probe and one removal", a)
	}
	// The first probe still hangs: the two overlapped, as the test means.
	if a.Probes["unreachable"] != 0 || a.Probes["alive"] != 0 {
		t.Fatalf("advisory stats %+v: the first connection's probe ended, the test proves nothing", a)
	}
	if r.g.live("orders", in.InstanceID) {
		t.Fatal("the crashed instance is still listed")
	}
}

// connectionOf returns the server and client IDs that name nc's
// connection in a record.
func connectionOf(t *testing.T, nc *nats.Conn) (string, uint64) {
	t.Helper()
	id, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	return nc.ConnectedServerId(), id
}

// hangingListener returns the host and port of a loopback listener with a
// backlog of 0 whose accept queue is full (one connection made, never
// accepted): Linux drops the SYN of any further connect, which hangs
// until its timeout. It is closed at the end of the test.
func hangingListener(t *testing.T) (string, int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "hanging listener")
	t.Cleanup(func() { f.Close() })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// Fill the queue: connect until a connect times out (the first
	// succeeds; the kernel queues it, nobody accepts it).
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "127.0.0.1", port
		}
		t.Fatal(err)
	}
	t.Fatal("the listener's accept queue never filled")
	return "", 0
}
