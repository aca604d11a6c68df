package serverlist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushlb/pushlb/internal/ctxutil"
)

// Lookup defaults. The seed system slept 3 x 3 s on a registry miss; an
// instance announces online only after its registry put returned, so a miss
// is the gateway's mirror running a few milliseconds behind, and 4 attempts
// over about 35 ms cover it.
const (
	DefaultLookupAttempts       = 4
	DefaultLookupInitialBackoff = 5 * time.Millisecond
	DefaultLookupMaxBackoff     = 100 * time.Millisecond
	DefaultLookupAttemptTimeout = time.Second
	// resolveParallelism bounds the concurrent fallbacks of ResolveAll.
	resolveParallelism = 8
)

// LookupConfig configures a [Lookup]. The zero value means every default;
// negative values are invalid.
type LookupConfig struct {
	// Attempts is the number of direct registry reads after a mirror miss,
	// at least 1. Zero means DefaultLookupAttempts (4).
	Attempts int
	// InitialBackoff is the wait before the second attempt; each further
	// wait doubles, up to MaxBackoff. Zero means 5 ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between attempts. Zero means 100 ms. With the
	// defaults a miss gives up after 5+10+20 = 35 ms of waiting plus four
	// registry round trips.
	MaxBackoff time.Duration
	// AttemptTimeout bounds each registry read, inside whatever deadline the
	// caller's ctx has. Zero means 1 s.
	AttemptTimeout time.Duration
}

// DefaultLookupConfig returns the defaults spelled out.
func DefaultLookupConfig() LookupConfig {
	return LookupConfig{
		Attempts:       DefaultLookupAttempts,
		InitialBackoff: DefaultLookupInitialBackoff,
		MaxBackoff:     DefaultLookupMaxBackoff,
		AttemptTimeout: DefaultLookupAttemptTimeout,
	}
}

func (c LookupConfig) withDefaults() (LookupConfig, error) {
	if c.Attempts < 0 || c.InitialBackoff < 0 || c.MaxBackoff < 0 || c.AttemptTimeout < 0 {
		return c, fmt.Errorf("%w: negative lookup setting in %+v", ErrInvalidConfig, c)
	}
	d := DefaultLookupConfig()
	if c.Attempts == 0 {
		c.Attempts = d.Attempts
	}
	if c.InitialBackoff == 0 {
		c.InitialBackoff = d.InitialBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = d.MaxBackoff
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = d.AttemptTimeout
	}
	c.MaxBackoff = max(c.MaxBackoff, c.InitialBackoff)
	return c, nil
}

// LookupStats are counters since the Lookup was created.
type LookupStats struct {
	// Hits are resolutions served by the mirror at once.
	Hits uint64
	// Misses are resolutions the mirror could not serve at once.
	Misses uint64
	// Fallbacks are misses resolved later, by a registry read or by the
	// mirror catching up between attempts.
	Fallbacks uint64
	// Failures are misses that did not resolve: not found after every
	// attempt, a registry error, an invalid ID, or ctx ending.
	Failures uint64
	// RegistryReads are the direct registry reads the misses made, counted
	// as each one returns (whatever its result).
	RegistryReads uint64
}

// Lookup resolves instance IDs to instances: from the mirror when it holds
// the ID (a map read), else from the registry with bounded retries, because
// an event can outrun the mirror. It is safe for concurrent use.
type Lookup struct {
	reg    *Registry
	mirror *Mirror // may be nil
	cfg    LookupConfig

	hits, misses, fallbacks, failures, reads atomic.Uint64
}

// NewLookup returns a Lookup over reg and, if not nil, mirror. Without a
// mirror every resolution reads the registry. It returns an error wrapping
// ErrInvalidConfig for a bad cfg.
func NewLookup(reg *Registry, mirror *Mirror, cfg LookupConfig) (*Lookup, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil registry", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Lookup{reg: reg, mirror: mirror, cfg: cfg}, nil
}

// Config returns the configuration in effect, defaults filled in.
func (l *Lookup) Config() LookupConfig { return l.cfg }

// Stats returns the counters.
func (l *Lookup) Stats() LookupStats {
	return LookupStats{
		Hits:          l.hits.Load(),
		Misses:        l.misses.Load(),
		Fallbacks:     l.fallbacks.Load(),
		Failures:      l.failures.Load(),
		RegistryReads: l.reads.Load(),
	}
}

// Resolve returns the instance service/id. A mirror hit returns at once.
// On a miss it reads the registry up to Attempts times with exponential
// backoff, checking the mirror again before each retry, and gives up early
// when ctx ends. It returns an error wrapping ErrNotFound if the instance
// is not registered, ErrInvalidInstance for an invalid service or ID
// (without retrying), or the last registry or ctx error.
func (l *Lookup) Resolve(ctx context.Context, service, id string) (Instance, error) {
	if l.mirror != nil {
		if in, ok := l.mirror.Get(service, id); ok {
			l.hits.Add(1)
			return in, nil
		}
	}
	l.misses.Add(1)
	in, err := l.fallback(ctx, service, id)
	if err != nil {
		l.failures.Add(1)
		return Instance{}, err
	}
	l.fallbacks.Add(1)
	return in, nil
}

func (l *Lookup) fallback(ctx context.Context, service, id string) (Instance, error) {
	if _, err := EncodeKey(service, id); err != nil {
		return Instance{}, err
	}
	backoff := l.cfg.InitialBackoff
	var lastErr error
	for attempt := range l.cfg.Attempts {
		if attempt > 0 {
			if err := ctxutil.Sleep(ctx, backoff); err != nil {
				return Instance{}, fmt.Errorf("serverlist: resolve %s/%s: %w (last: %w)", service, id, err, lastErr)
			}
			backoff = min(2*backoff, l.cfg.MaxBackoff)
			if l.mirror != nil {
				if in, ok := l.mirror.Get(service, id); ok {
					return in, nil
				}
			}
		}
		actx, cancel := context.WithTimeout(ctx, l.cfg.AttemptTimeout)
		in, err := l.reg.Get(actx, service, id)
		cancel()
		l.reads.Add(1)
		if err == nil {
			return in, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	if errors.Is(lastErr, ErrNotFound) {
		return Instance{}, fmt.Errorf("%w: %s/%s after %d attempts", ErrNotFound, service, id, l.cfg.Attempts)
	}
	return Instance{}, lastErr
}

// ResolveAll resolves every ID of one service. It returns the instances that
// resolved, in the order of ids, and, if some did not, an error joining one
// error per failed ID (each wrapping ErrNotFound or the cause). A non-nil
// error with a non-empty slice is the normal partial result: callers use the
// instances they got.
func (l *Lookup) ResolveAll(ctx context.Context, service string, ids []string) ([]Instance, error) {
	found, errs := l.ResolveEach(ctx, service, ids)
	out := found[:0]
	for i := range found {
		if errs[i] == nil {
			out = append(out, found[i])
		}
	}
	return out, errors.Join(errs...)
}

// ResolveEach resolves every ID of one service and reports the result per
// ID: found[i] is valid when errs[i] is nil; errs[i] wraps ErrNotFound when
// the registry does not hold ids[i], or the cause (an unreachable registry,
// ctx), so callers can tell an instance that is gone from an outage. Mirror
// hits are map reads; misses are resolved concurrently, a few at a time.
func (l *Lookup) ResolveEach(ctx context.Context, service string, ids []string) (found []Instance, errs []error) {
	found = make([]Instance, len(ids))
	errs = make([]error, len(ids))
	var missed []int
	for i, id := range ids {
		if l.mirror != nil {
			if in, ok := l.mirror.Get(service, id); ok {
				l.hits.Add(1)
				found[i] = in
				continue
			}
		}
		missed = append(missed, i)
	}
	if len(missed) == 0 {
		return found, errs
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, resolveParallelism)
	for _, i := range missed {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			l.misses.Add(1)
			in, err := l.fallback(ctx, service, ids[i])
			if err != nil {
				l.failures.Add(1)
				errs[i] = err
				return
			}
			l.fallbacks.Add(1)
			found[i] = in
		})
	}
	wg.Wait()
	return found, errs
}
