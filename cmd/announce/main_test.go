package main

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// The binaries under test, built once by TestMain.
var announceBin, backendBin string

// TestMain builds the binaries; once the tests passed, what this process
// started (NATS servers, clients, watchers) must be gone too. No goroutine
// is ignored: the NATS servers' cleanup waits for their shutdown.
func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, func(bins []string) { announceBin, backendBin = bins[0], bins[1] },
		".", "../../internal/testkit/testbackend"))
}

// --- the NATS side: events and registry -------------------------------

// seen is an event and when the test received it.
type seen struct {
	events.Event
	at time.Time
}

// world is a NATS server with a subscriber on lb.svc.> and the registry.
type world struct {
	srv     *natstest.Server
	reg     *serverlist.Registry
	nc      *nats.Conn
	evs     chan seen
	barrier chan struct{} // a message on barrierSubject came, after every event before it
}

// barrierSubject is under the events' wildcard, so that the subscription
// sees a message on it in order with the events: see quiet.
var barrierSubject = strings.TrimSuffix(events.WildcardSubject(events.DefaultPrefix), ">") + "test-barrier.sync"

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldWith(t, natstest.Start(t))
}

func newWorldWith(t *testing.T, srv *natstest.Server) *world {
	t.Helper()
	return newWorldTTL(t, srv, serverlist.DefaultTTL)
}

// newWorldTTL is newWorldWith over a registry bucket it creates with ttl.
func newWorldTTL(t *testing.T, srv *natstest.Server, ttl time.Duration) *world {
	t.Helper()
	w := &world{srv: srv, evs: make(chan seen, 32), barrier: make(chan struct{}, 1)}
	nc := w.srv.Connect(t)
	w.nc = nc
	if _, err := nc.Subscribe(events.WildcardSubject(events.DefaultPrefix), func(m *nats.Msg) {
		if m.Subject == barrierSubject {
			w.barrier <- struct{}{}
			return
		}
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
	// The world's Open creates the bucket: announce adopts its TTL.
	w.reg, err = serverlist.Open(testCtx(t), js, serverlist.RegistryConfig{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// next returns the next event, failing after 5 s.
func (w *world) next(t *testing.T) seen {
	t.Helper()
	return testutil.Receive(t, w.evs, 5*time.Second, "the next event")
}

// quiet fails if an event came that the test did not take with next. It
// publishes a barrier message on the events' subscription and waits for
// it: announce flushes each event it publishes, so an event published
// before what the test observed (a log line, an exit) reached the server
// before the barrier and is delivered before it, in order.
func (w *world) quiet(t *testing.T) {
	t.Helper()
	if err := w.nc.Publish(barrierSubject, nil); err != nil {
		t.Fatal(err)
	}
	testutil.Receive(t, w.barrier, 5*time.Second, "the barrier message")
	select {
	case e := <-w.evs:
		t.Fatalf("unexpected event %+v", e.Event)
	default:
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

// Bounds of the waits for a process: one line of output, an exit.
const (
	lineTimeout = 5 * time.Second
	exitTimeout = 10 * time.Second
)

// start runs bin with args; the test's cleanup kills it.
func start(t *testing.T, bin string, args ...string) *testutil.Proc {
	t.Helper()
	return testutil.Start(t, bin, args...)
}

func announce(t *testing.T, args ...string) *testutil.Proc { return start(t, announceBin, args...) }

// noLine fails if a stdout line containing want has come.
func noLine(t *testing.T, p *testutil.Proc, want string) {
	t.Helper()
	for _, l := range p.Lines() {
		if l.Stream == testutil.Stdout && strings.Contains(l.Text, want) {
			t.Fatalf("unexpected stdout line %q", l.Text)
		}
	}
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
