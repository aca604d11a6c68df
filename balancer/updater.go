package balancer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// A ServerList is a source of a service's servers (Ribbon's ServerList). It
// is polled by the balancer's polling updater (see Balancer.Start), from one
// goroutine at a time; the methods must honour ctx, whose values are those
// given to Start.
//
// Where the updater serves: a configured listOfServers reaches its
// balancer through it (StaticList, Ribbon's ConfigurationBasedServerList),
// in the gateway as in the library, until the push path takes the service
// over (lbvisitor stops the polling for good); and a program that uses the
// balancer without NATS plugs in a source that cannot push (DNS, a file, a
// config service) with WithServerList or Factory's WithServerListProvider.
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

// pollingUpdater refreshes a balancer's list from a ServerList: first
// after an initial delay (1 s), then every interval (Ribbon's
// ServerListRefreshInterval, 30 s). A failed poll keeps the current list.
// Balancer.Start starts it; Close and StopPolling stop it for good, so
// that nothing can restart polling behind the push path's back.
type pollingUpdater struct {
	b            *Balancer
	list         ServerList
	initialDelay time.Duration
	interval     time.Duration

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool

	polls    atomic.Int64 // polls made, including failed ones
	failures atomic.Int64
	lastErr  atomic.Pointer[error]
}

func newPollingUpdater(b *Balancer, list ServerList, initialDelay, interval time.Duration) *pollingUpdater {
	return &pollingUpdater{b: b, list: list, initialDelay: initialDelay, interval: interval}
}

// start starts polling with ctx (which must not be cancelled but by stop);
// it is a no-op when running or stopped.
func (u *pollingUpdater) start(ctx context.Context) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cancel != nil || u.stopped {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	u.cancel, u.done = cancel, make(chan struct{})
	go u.run(ctx, u.done)
}

// stop stops polling for good and waits for a poll in progress to end. It
// is safe to call at any time, any number of times.
func (u *pollingUpdater) stop() {
	u.mu.Lock()
	cancel, done := u.cancel, u.done
	u.cancel, u.done, u.stopped = nil, nil, true
	u.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// running reports whether the updater is polling.
func (u *pollingUpdater) running() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.cancel != nil
}

// lastError returns the error of the last failed poll, or nil.
func (u *pollingUpdater) lastError() error {
	if p := u.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (u *pollingUpdater) run(ctx context.Context, done chan struct{}) {
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
func (u *pollingUpdater) poll(ctx context.Context, first bool) {
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

var _ ServerList = StaticList(nil)
