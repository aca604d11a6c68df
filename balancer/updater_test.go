package balancer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// switchList is a ServerList whose answer tests change.
type switchList struct {
	mu      sync.Mutex
	servers []Server
	err     error
}

func (l *switchList) set(s []Server, err error) {
	l.mu.Lock()
	l.servers, l.err = s, err
	l.mu.Unlock()
}

func (l *switchList) InitialServers(ctx context.Context) ([]Server, error) {
	return l.UpdatedServers(ctx)
}

func (l *switchList) UpdatedServers(context.Context) ([]Server, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.servers), l.err
}

func withPollDelay(d time.Duration) Option {
	return func(b *Balancer) error { b.pollDelay = d; return nil }
}

func TestPollingUpdater(t *testing.T) {
	src := &switchList{servers: servers(2, "", 0)}
	cfg := DefaultConfig()
	cfg.ServerListRefreshInterval = 5 * time.Millisecond
	b, err := New("svc", cfg, WithServerList(src), withPollDelay(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Start(t.Context())
	testutil.Eventually(t, "initial list", func() bool { return len(b.AllServers()) == 2 })

	src.set(servers(3, "", 0), nil)
	testutil.Eventually(t, "updated list", func() bool { return len(b.AllServers()) == 3 })

	// A failing source keeps the last good list.
	src.set(nil, errors.New("registry down"))
	u := b.updater
	before := u.failures.Load()
	testutil.Eventually(t, "a failed poll", func() bool { return u.failures.Load() > before })
	if len(b.AllServers()) != 3 || u.lastError() == nil {
		t.Fatalf("a failed poll changed the list or lost its error: %d, %v", len(b.AllServers()), u.lastError())
	}

	// Stopped: the push path owns the list. StopPolling returns once the
	// polling goroutine has exited, so no poll can follow it: the checks
	// below need no waiting.
	b.StopPolling()
	if b.Polling() {
		t.Fatal("still polling after StopPolling")
	}
	src.set(servers(1, "", 0), nil)
	polls := u.polls.Load()
	if err := b.SetServers(servers(2, "", 10)); err != nil {
		t.Fatal(err)
	}

	// Stopped for good: neither Start nor the updater restarts it.
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	u.start(t.Context())
	if b.Polling() || u.polls.Load() != polls {
		t.Fatal("polling restarted after StopPolling")
	}
	if got := ids(b.AllServers()); !slices.Equal(got, []string{"s10", "s11"}) {
		t.Fatalf("the pushed list was overwritten: %v", got)
	}
	b.Close()
	if b.Polling() {
		t.Fatal("updater outlived its balancer")
	}
}

func TestStopPollingBeforeStart(t *testing.T) {
	src := &switchList{servers: servers(2, "", 0)}
	b, err := New("svc", DefaultConfig(), WithServerList(src), withPollDelay(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.StopPolling()
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if b.Polling() || b.updater != nil {
		t.Fatal("Start polled although StopPolling came first")
	}
}

func TestStartHonoursDoneContext(t *testing.T) {
	b, err := New("svc", DefaultConfig(), WithServerList(StaticList(servers(1, "", 0))))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a done context: %v", err)
	}
	if b.Polling() {
		t.Fatal("a failed Start started polling")
	}
}

func TestStaticListFromConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ListOfServers = []string{"127.0.0.1:9001", "https://127.0.0.1:9002"}
	b, err := New("svc", cfg, withPollDelay(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Start(t.Context())
	testutil.Eventually(t, "static list", func() bool { return len(b.AllServers()) == 2 })
	if s := b.AllServers()[1]; s.URLScheme() != "https" || s.Port != 9002 {
		t.Fatalf("got %+v", s)
	}
}
