package serverlist_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// env is one test's NATS server, client and registry.
type env struct {
	srv *natstest.Server
	js  jetstream.JetStream
	reg *serverlist.Registry
}

func newEnv(t testing.TB, cfg serverlist.RegistryConfig) *env {
	t.Helper()
	srv := natstest.Start(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := serverlist.Open(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, js: js, reg: reg}
}

// repeat calls f every interval in a goroutine until f returns false or
// stop is called; stop waits for the goroutine.
func repeat(every time.Duration, f func(ctx context.Context) bool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if !f(ctx) {
					return
				}
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// testCtx is a context bounded by timeout and by the end of the test.
func testCtx(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

func inst(service, id string, port int) serverlist.Instance {
	return serverlist.Instance{
		Service:     service,
		InstanceID:  id,
		Host:        "127.0.0.1",
		Port:        port,
		Zone:        "a",
		Metadata:    map[string]string{"version": "1"},
		Incarnation: 1,
	}
}

// register registers every instance and returns the revision of the last
// put.
func register(t testing.TB, reg *serverlist.Registry, ins ...serverlist.Instance) (revision uint64) {
	t.Helper()
	ctx := testCtx(t, 5*time.Second)
	for _, in := range ins {
		rev, err := reg.Register(ctx, in)
		if err != nil {
			t.Fatalf("register %s/%s: %v", in.Service, in.InstanceID, err)
		}
		revision = rev
	}
	return revision
}

// waitApplied waits until the mirror has applied the bucket up to rev: its
// state and its OnChange calls reflect every entry up to it.
func waitApplied(t testing.TB, m *serverlist.Mirror, rev uint64) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("the mirror to apply revision %d", rev), func() bool { return m.Stats().Revision >= rev })
}

// startMirror starts a mirror, waits for its first sync and stops it at the
// end of the test.
func startMirror(t testing.TB, reg *serverlist.Registry, cfg serverlist.MirrorConfig) *serverlist.Mirror {
	t.Helper()
	m := serverlist.NewMirror(reg, cfg)
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if err := m.WaitSynced(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("WaitSynced: %v", err)
	}
	return m
}

func mustJetStream(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
