package balancer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A ServerList is a source of a service's servers (Ribbon's ServerList). It
// is polled by a PollingUpdater; the methods must honour ctx and be safe for
// use from one goroutine at a time.
type ServerList interface {
	// InitialServers returns the list at start-up.
	InitialServers(ctx context.Context) ([]Server, error)
	// UpdatedServers returns the current list.
	UpdatedServers(ctx context.Context) ([]Server, error)
}

// StaticList is a fixed list (Ribbon's ConfigurationBasedServerList, from
// listOfServers). It doubles as a test fake.
type StaticList []Server

// InitialServers implements ServerList.
func (l StaticList) InitialServers(context.Context) ([]Server, error) { return slices.Clone(l), nil }

// UpdatedServers implements ServerList.
func (l StaticList) UpdatedServers(context.Context) ([]Server, error) { return slices.Clone(l), nil }

// PollingUpdater refreshes a balancer's list from a ServerList: first
// after an initial delay (1 s), then every interval (Ribbon's
// ServerListRefreshInterval, 30 s). A failed poll keeps the current list.
// It can be stopped and started again; the balancer stops it on Close, and
// the push path stops it when it takes the list over.
type PollingUpdater struct {
	b            *Balancer
	list         ServerList
	initialDelay time.Duration
	interval     time.Duration

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	polls    atomic.Int64
	failures atomic.Int64
	lastErr  atomic.Pointer[error]
}

func newPollingUpdater(b *Balancer, list ServerList, initialDelay, interval time.Duration) *PollingUpdater {
	return &PollingUpdater{b: b, list: list, initialDelay: initialDelay, interval: interval}
}

// Start starts polling; it is a no-op when already running.
func (u *PollingUpdater) Start() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	u.cancel, u.done = cancel, make(chan struct{})
	go u.run(ctx, u.done)
}

// Stop stops polling and waits for a poll in progress to end. It is safe to
// call at any time, any number of times.
func (u *PollingUpdater) Stop() {
	u.mu.Lock()
	cancel, done := u.cancel, u.done
	u.cancel, u.done = nil, nil
	u.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Running reports whether the updater is polling.
func (u *PollingUpdater) Running() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cancel != nil
}

// Polls returns the number of polls made, and Failures those that failed.
func (u *PollingUpdater) Polls() int64    { return u.polls.Load() }
func (u *PollingUpdater) Failures() int64 { return u.failures.Load() }

// LastError returns the error of the last failed poll, or nil.
func (u *PollingUpdater) LastError() error {
	if p := u.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (u *PollingUpdater) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTimer(u.initialDelay)
	defer t.Stop()
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		u.poll(ctx, first)
		first = false
		t.Reset(u.interval)
	}
}

// poll reads the source once and applies the list.
func (u *PollingUpdater) poll(ctx context.Context, first bool) {
	u.polls.Add(1)
	var servers []Server
	var err error
	if first {
		servers, err = u.list.InitialServers(ctx)
	} else {
		servers, err = u.list.UpdatedServers(ctx)
	}
	if err == nil {
		err = u.b.SetServers(servers)
		if len(servers) > 0 && err != nil {
			// Some entries were invalid; the valid ones are applied.
			u.failures.Add(1)
			u.lastErr.Store(&err)
			return
		}
	}
	if err != nil && ctx.Err() == nil {
		u.failures.Add(1)
		u.lastErr.Store(&err)
	}
}
