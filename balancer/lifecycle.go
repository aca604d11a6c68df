package balancer

import (
	"context"
)

// Start starts the background work the configuration asks for: the ping
// loop when a real Pinger is set, and the polling updater when a
// ServerList is set (or ListOfServers configured); New starts nothing. ctx
// bounds the start only: Start does not wait for a ping or a poll, and the
// work runs until Close whatever becomes of ctx, but the values of ctx
// reach the Pinger and ServerList calls. Calling it again is a no-op;
// after Close it returns ErrClosed.
func (b *Balancer) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if b.started {
		return nil
	}
	b.started = true
	if _, system := b.shared.clock.(systemClock); system {
		coarse.acquire()
		b.shared.coarse.Store(true)
	}
	base := context.WithoutCancel(ctx)
	if b.pinger != nil && !isNoOpPing(b.pinger) {
		b.pingLoop = startPingLoop(base, b, b.pinger, b.cfg.Ping.Interval)
	}
	if b.source != nil && !b.noPolling {
		b.updater = newPollingUpdater(b, b.source, b.pollDelay, b.cfg.ServerListRefreshInterval)
		b.updater.start(base)
	}
	return nil
}

// Polling reports whether the polling updater runs: the balancer has a
// ServerList, was started, and neither StopPolling nor Close was called.
func (b *Balancer) Polling() bool {
	b.mu.Lock()
	u := b.updater
	b.mu.Unlock()
	return u != nil && u.running()
}

// StopPolling stops the polling updater for good, and waits for a poll in
// progress: the push path calls it when it takes over the balancer's list,
// so that polls no longer overwrite pushed lists. Called before Start, it
// keeps Start from polling. It is safe to call at any time, any number of
// times.
func (b *Balancer) StopPolling() {
	b.mu.Lock()
	b.noPolling = true
	u := b.updater
	b.mu.Unlock()
	if u != nil {
		u.stop()
	}
}

// Close stops the ping loop, the polling updater and the slow-start
// refresher, and waits for them.
// Choose and Pick keep answering from the last list, and Picks already
// made may still be reported. Close is idempotent.
func (b *Balancer) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	pl, up := b.pingLoop, b.updater
	if b.shared.coarse.Swap(false) {
		coarse.release()
	}
	b.mu.Unlock()
	if pl != nil {
		pl.stop()
	}
	if up != nil {
		up.stop()
	}
	b.slow.close()
	return nil
}
