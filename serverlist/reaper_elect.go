package serverlist

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/base/ctxutil"
)

// run is the reaper's goroutine until ctx ends: it takes the lock and
// leads while it holds it, follows the leader while another holds it, and
// when it may not write the lock, stays out and watches for a leader.
func (r *Reaper) run(ctx context.Context) {
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, lockWriteTimeout)
		rev, err := r.reg.kv.Create(cctx, ReaperLockKey, []byte(r.cfg.Node))
		cancel()
		switch {
		case err == nil:
			r.lead(ctx, rev)
			continue
		case errors.Is(err, jetstream.ErrKeyExists):
			err = r.follow(ctx)
		case err != nil && r.refused(err):
			r.notPermitted.Store(true)
			r.log.Info().Err(err).Str("bucket", r.reg.cfg.Bucket).
				Msg("serverlist: this process may not write the reaper lock, so it does not reap; another process must (docs/security.md)")
			r.watchLeaders(ctx)
			return
		}
		if err != nil && ctx.Err() == nil {
			r.errorsSeen.Add(1)
			r.log.Warn().Err(err).Msg("serverlist: reaper election")
			_ = ctxutil.Sleep(ctx, reaperRetry)
		}
	}
}

// refused reports whether err, the answer to a write of the lock, is the
// server's refusal: a permissions violation is reported asynchronously and
// the write's request then times out, so the connection's last error tells.
func (r *Reaper) refused(err error) bool { return r.refusedOn(err, ReaperLockKey) }

// refusedOn is refused for a write of key.
func (r *Reaper) refusedOn(err error, key string) bool {
	if errors.Is(err, nats.ErrPermissionViolation) {
		return true
	}
	last := r.reg.js.Conn().LastError()
	return last != nil && errors.Is(last, nats.ErrPermissionViolation) &&
		strings.Contains(last.Error(), r.reg.subject(key))
}

// watchLeaders watches the lock until ctx ends, for a reaper that may not
// lead: when no reaper has held it for more than a TTL, it logs a warning
// (once per absence) and reports Unled, since crashed instances are then
// not removed.
func (r *Reaper) watchLeaders(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.watchLock(ctx, r.reg.cfg.TTL); err != nil && ctx.Err() == nil {
			r.errorsSeen.Add(1)
			_ = ctxutil.Sleep(ctx, reaperRetry)
		}
	}
}

// watchLockKey starts a watch of the lock; stop ends it and drains it.
func (r *Reaper) watchLockKey(ctx context.Context) (w jetstream.KeyWatcher, stop func(), err error) {
	if w, stop, err = r.watchKeys(ctx, ReaperLockKey); err != nil {
		return nil, nil, fmt.Errorf("watch the reaper lock: %w", err)
	}
	return w, stop, nil
}

// watchLock is one watch of the lock for watchLeaders.
func (r *Reaper) watchLock(ctx context.Context, ttl time.Duration) error {
	w, stop, err := r.watchLockKey(ctx)
	if err != nil {
		return err
	}
	defer stop()
	absent := time.NewTimer(ttl) // stopped while a reaper holds the lock
	defer absent.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-absent.C:
			if !r.unled.Swap(true) {
				r.log.Warn().Str("bucket", r.reg.cfg.Bucket).Dur("for", ttl).
					Msg("serverlist: no reaper has led for a lease: the records of crashed instances are not removed; run a process with the reaper's permissions (docs/security.md)")
			}
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return errors.New("the reaper lock's watch ended")
			case e == nil:
			case e.Operation() == jetstream.KeyValuePut:
				absent.Stop()
				if r.unled.Swap(false) {
					r.log.Info().Msg("serverlist: a reaper leads again")
				}
			default:
				absent.Reset(ttl)
			}
		}
	}
}

// follow watches the lock until it is gone (its leader gave it up or died).
func (r *Reaper) follow(ctx context.Context) error {
	w, stop, err := r.watchLockKey(ctx)
	if err != nil {
		return err
	}
	defer stop()
	held := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return errors.New("the reaper lock's watch ended")
			case e == nil:
				if !held {
					return nil // gone before the watch began
				}
			case e.Operation() == jetstream.KeyValuePut:
				held = true
			default:
				return nil
			}
		}
	}
}
