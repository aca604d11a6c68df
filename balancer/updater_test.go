package balancer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testutil"
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
	b.Start()
	testutil.Eventually(t, "initial list", func() bool { return len(b.AllServers()) == 2 })

	src.set(servers(3, "", 0), nil)
	testutil.Eventually(t, "updated list", func() bool { return len(b.AllServers()) == 3 })

	// A failing source keeps the last good list.
	src.set(nil, errors.New("registry down"))
	u := b.Updater()
	before := u.Failures()
	testutil.Eventually(t, "a failed poll", func() bool { return u.Failures() > before })
	if len(b.AllServers()) != 3 || u.LastError() == nil {
		t.Fatalf("a failed poll changed the list or lost its error: %d, %v", len(b.AllServers()), u.LastError())
	}

	// Stopped: no more polls; the push path owns the list.
	b.StopPolling()
	if u.Running() {
		t.Fatal("still running after StopPolling")
	}
	polls := u.Polls()
	src.set(servers(1, "", 0), nil)
	time.Sleep(30 * time.Millisecond)
	if u.Polls() != polls || len(b.AllServers()) != 3 {
		t.Fatal("polled after Stop")
	}

	// Restarted: polls again.
	u.Start()
	testutil.Eventually(t, "list after restart", func() bool { return len(b.AllServers()) == 1 })
	b.Close()
	if u.Running() {
		t.Fatal("updater outlived its balancer")
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
	b.Start()
	testutil.Eventually(t, "static list", func() bool { return len(b.AllServers()) == 2 })
	if s := b.AllServers()[1]; s.URLScheme() != "https" || s.Port != 9002 {
		t.Fatalf("got %+v", s)
	}
}
