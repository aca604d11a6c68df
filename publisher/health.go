package publisher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// Defaults of HealthConfig.
const (
	// DefaultHealthInterval is the pause between two health checks.
	DefaultHealthInterval = 5 * time.Second
	// DefaultHealthFailures is how many consecutive failed checks take the
	// instance down.
	DefaultHealthFailures = 3
)

// DownReasonPrefix starts the reason of the offline event that MarkDown
// publishes when given no reason, and that WatchHealth publishes (followed
// by the check's error): gateways and operators tell a health-gated
// removal from a shutdown by it.
const DownReasonPrefix = "unhealthy"

// Down reports whether the instance is announced but down: MarkDown took
// it out, and no MarkUp (or Announce) brought it back yet.
func (p *Publisher) Down() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// MarkDown takes an announced instance out of every gateway's lists while
// the process lives on, as a failing health check does: it publishes the
// offline event with reason (DownReasonPrefix when empty), so gateways
// stop routing at once, then rewrites the instance's record marked down
// (serverlist.StatusDown), as Eureka's DOWN status or a failing Consul
// check: the record and its lease stay, so the registry still shows the
// instance, while gateways read it as absent, so that no resync,
// anti-entropy pass or lease probe brings it back. The gossip node stays.
//
// The instance is down from the call on, even when the event or the
// record's write fails (then the error says which, and the lease, which
// is not renewed then, ends the record). MarkDown of an instance already
// down does nothing. Before Announce, or after Withdraw, it returns
// ErrNotAnnounced; once replaced, ErrReplaced; after Close, ErrClosed.
func (p *Publisher) MarkDown(ctx context.Context, reason string) error {
	if reason == "" {
		reason = DownReasonPrefix
	}
	reason = fitReason(reason)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if p.down {
		return nil
	}
	p.stopLeaseLocked()
	p.down = true
	in := p.inst.Clone()
	in.Status = serverlist.StatusDown
	perr := p.publish(ctx, in, events.Offline, reason)
	claimed, werr := p.claim(ctx, in, true)
	if claimed.Record != 0 {
		// The lease goes on, and re-asserts the record marked down.
		p.inst = in
		p.startLeaseLocked(claimed)
	}
	if perr != nil || werr != nil {
		return fmt.Errorf("publisher: mark %s/%s down: %w", in.Service, in.InstanceID, errors.Join(perr, werr))
	}
	return nil
}

// MarkUp brings an instance that MarkDown took out back: it writes its
// record again, starts its lease and publishes the online event, as
// Announce does, with the same incarnation (it is the same life of the
// instance: the record's write brings it back on every gateway, whatever
// the offline event said). It keeps the identity rules: a record another
// process wrote meanwhile with a newer incarnation means this one was
// replaced (it yields, as the lease loop does, and MarkUp returns
// ErrReplaced); an older or forged one is overwritten.
//
// MarkUp of an instance that is not down does nothing. On an error the
// instance stays down unless its record was written (then the lease runs
// and the record routes, even if the online event failed). Before
// Announce, or after Withdraw, it returns ErrNotAnnounced; after Close,
// ErrClosed.
func (p *Publisher) MarkUp(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usableLocked(); err != nil {
		return err
	}
	if !p.down {
		return nil
	}
	p.stopLeaseLocked() // the lease of the record marked down
	in := p.inst.Clone()
	in.Status = "" // serving again
	held, err := p.reg.GetEntry(ctx, in.Service, in.InstanceID)
	if err == nil && serverlist.Superseded(in, held.Instance, time.Now()) {
		p.yield(in, held.Instance)
		return ErrReplaced
	}
	// The connection may have changed while down (a reconnect): the
	// record names the current one.
	if c := connectionOf(p.nc); !c.IsZero() {
		in.NATSServerID, in.NATSClientID = c.ServerID, c.ClientID
	}
	in = p.joinGossipLocked(ctx, in)
	claimed, registered, err := p.announce(ctx, in, true)
	if registered {
		p.inst, p.down = in.Clone(), false
		p.startLeaseLocked(claimed)
	}
	if err != nil {
		return fmt.Errorf("publisher: mark %s/%s up: %w", in.Service, in.InstanceID, err)
	}
	return nil
}

// fitReason makes reason a valid offline reason: UTF-8, at most
// events.MaxReasonLength bytes, cut at a character boundary. A check's
// error may be anything.
func fitReason(reason string) string {
	reason = strings.ToValidUTF8(reason, "?")
	if len(reason) <= events.MaxReasonLength {
		return reason
	}
	cut := events.MaxReasonLength
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

// usableLocked returns the error that MarkDown and MarkUp return when the
// publisher has no announced instance of its own.
func (p *Publisher) usableLocked() error {
	switch {
	case p.closed:
		return ErrClosed
	case p.replacedBy.Load() != nil:
		return ErrReplaced
	case !p.announced:
		return ErrNotAnnounced
	}
	return nil
}

// HealthConfig configures WatchHealth. Zero values take the defaults.
type HealthConfig struct {
	// Check tells whether the instance can serve: nil when it can. It is
	// called on WatchHealth's goroutine, one call at a time, with a
	// context that ends after Timeout. Required.
	Check func(ctx context.Context) error
	// Interval is the pause between the end of one check and the start of
	// the next. Default (zero): DefaultHealthInterval.
	Interval time.Duration
	// Failures is how many consecutive failed checks take the instance
	// down (MarkDown). Default (zero): DefaultHealthFailures. One passing
	// check brings it back (MarkUp).
	Failures int
	// Timeout bounds one check. Default (zero): Interval, at least one
	// second.
	Timeout time.Duration
	// OnChange, when set, is called on WatchHealth's goroutine after each
	// change it made: up false after MarkDown (cause is the last check's
	// error), true after MarkUp (cause nil); err is MarkDown's or MarkUp's
	// error, if any. A MarkUp that failed is not a change: the instance
	// stays down and the next passing check tries again.
	OnChange func(up bool, cause, err error)
	// OnCheck, when set, is called after every check with its error and
	// the count of consecutive failures so far (0 after a pass).
	OnCheck func(err error, failures int)
}

// WatchHealth checks the instance every Interval with h.Check, takes it
// down after Failures consecutive failures (MarkDown, with the reason
// "unhealthy: <error>") and up again after a passing check (MarkUp). It
// runs on the caller's goroutine and starts none: call it after Announce,
// in a goroutine of the caller's, and end it with ctx before Withdraw.
//
// It returns ctx's error when ctx ends, an error wrapping ErrInvalidConfig
// for a bad h, and ErrNotAnnounced, ErrReplaced or ErrClosed when a
// change finds the publisher so. Other failures of MarkDown and MarkUp
// (NATS unreachable) are reported to OnChange and logged; a MarkUp is
// tried again at the next passing check.
func (p *Publisher) WatchHealth(ctx context.Context, h HealthConfig) error {
	if h.Check == nil {
		return fmt.Errorf("%w: HealthConfig.Check is nil", ErrInvalidConfig)
	}
	if h.Interval == 0 {
		h.Interval = DefaultHealthInterval
	}
	if h.Failures == 0 {
		h.Failures = DefaultHealthFailures
	}
	if h.Timeout == 0 {
		h.Timeout = max(h.Interval, time.Second)
	}
	if h.Interval < 0 || h.Failures < 0 || h.Timeout < 0 {
		return fmt.Errorf("%w: health interval %v, failures %d and timeout %v must not be negative", ErrInvalidConfig, h.Interval, h.Failures, h.Timeout)
	}
	t := time.NewTimer(h.Interval)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, h.Timeout)
		cerr := h.Check(cctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if cerr != nil {
			failures++
		} else {
			failures = 0
		}
		if h.OnCheck != nil {
			h.OnCheck(cerr, failures)
		}
		down := p.Down()
		var err error
		switch {
		case cerr != nil && !down && failures >= h.Failures:
			err = p.MarkDown(ctx, DownReasonPrefix+": "+cerr.Error())
			p.logChange(false, cerr, err, false)
			if h.OnChange != nil {
				h.OnChange(false, cerr, err)
			}
		case cerr == nil && down:
			err = p.MarkUp(ctx)
			up := !p.Down()
			p.logChange(true, nil, err, up)
			if h.OnChange != nil && up {
				h.OnChange(true, nil, err)
			}
		}
		if errors.Is(err, ErrNotAnnounced) || errors.Is(err, ErrReplaced) || errors.Is(err, ErrClosed) {
			return err
		}
		t.Reset(h.Interval)
	}
}

// logChange logs a change WatchHealth made, or tried to (up: MarkUp;
// registered: MarkUp wrote the record, even if it returned an error).
func (p *Publisher) logChange(up bool, cause, err error, registered bool) {
	in := p.Instance()
	if errors.Is(err, ErrNotAnnounced) || errors.Is(err, ErrReplaced) || errors.Is(err, ErrClosed) {
		return
	}
	switch {
	case up && err != nil && registered:
		p.log.Warn().Err(err).Str("service", in.Service).Str("id", in.InstanceID).Msg("health check passes again: registered, but the online event failed; gateways route the instance from its record")
	case up && err != nil:
		p.log.Warn().Err(err).Str("service", in.Service).Str("id", in.InstanceID).Msg("health check passes again, but announcing the instance online failed; retrying at the next check")
	case up:
		p.log.Info().Str("service", in.Service).Str("id", in.InstanceID).Int64("incarnation", in.Incarnation).Msg("health check passes again: announced online")
	case err != nil:
		p.log.Error().Err(err).AnErr("cause", cause).Str("service", in.Service).Str("id", in.InstanceID).Msg("health check failing: marked down, but announcing it failed; the lease is no longer renewed, so the record ends with it")
	default:
		p.log.Warn().AnErr("cause", cause).Str("service", in.Service).Str("id", in.InstanceID).Msg("health check failing: announced offline (down) until it passes again")
	}
}
