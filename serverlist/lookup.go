package serverlist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/base/ctxutil"
	"github.com/pushlb/pushlb/internal/base/expiry"
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
	// DefaultNegativeTTL is how long an ID the registry did not hold
	// resolves as not found without asking it again.
	DefaultNegativeTTL = 30 * time.Second
	// DefaultRegistryReadsPerSecond bounds the direct registry reads that
	// misses make, all services together.
	DefaultRegistryReadsPerSecond = 200
	// resolveParallelism bounds the concurrent registry reads of one round.
	resolveParallelism = 8
	// maxNegative bounds the negative cache; when full, expired entries go,
	// then the whole cache if need be (misses then cost rate-limited reads).
	maxNegative = 65536
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
	// NegativeTTL is how long an ID found absent after every attempt
	// resolves as not found at once, without a registry read. The mirror is
	// still asked first, so with a mirror a later registration resolves as
	// soon as the mirror has it. Zero means 30 s.
	NegativeTTL time.Duration
	// ReadsPerSecond bounds the direct registry reads of every miss
	// together (a token bucket with a burst of one second's worth). A miss
	// that finds no token is not found, without a read and without being
	// cached: events naming IDs nobody registered cost a bounded load and
	// never queue behind each other. Zero means 200.
	ReadsPerSecond int
}

// DefaultLookupConfig returns the defaults spelled out.
func DefaultLookupConfig() LookupConfig {
	return LookupConfig{
		Attempts:       DefaultLookupAttempts,
		InitialBackoff: DefaultLookupInitialBackoff,
		MaxBackoff:     DefaultLookupMaxBackoff,
		AttemptTimeout: DefaultLookupAttemptTimeout,
		NegativeTTL:    DefaultNegativeTTL,
		ReadsPerSecond: DefaultRegistryReadsPerSecond,
	}
}

func (c LookupConfig) withDefaults() (LookupConfig, error) {
	if c.Attempts < 0 || c.InitialBackoff < 0 || c.MaxBackoff < 0 || c.AttemptTimeout < 0 || c.NegativeTTL < 0 || c.ReadsPerSecond < 0 {
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
	if c.NegativeTTL == 0 {
		c.NegativeTTL = d.NegativeTTL
	}
	if c.ReadsPerSecond == 0 {
		c.ReadsPerSecond = d.ReadsPerSecond
	}
	c.MaxBackoff = max(c.MaxBackoff, c.InitialBackoff)
	return c, nil
}

// LookupStats are counters since the Lookup was created.
type LookupStats struct {
	// Hits are resolutions served by the mirror at once.
	Hits uint64 `json:"hits"`
	// Misses are resolutions the mirror could not serve at once.
	Misses uint64 `json:"misses"`
	// Fallbacks are misses resolved later, by a registry read or by the
	// mirror catching up between attempts.
	Fallbacks uint64 `json:"fallbacks"`
	// Failures are misses that did not resolve: not found after every
	// attempt, a registry error, an invalid ID, or ctx ending.
	Failures uint64 `json:"failures"`
	// RegistryReads are the direct registry reads the misses made, counted
	// as each one returns (whatever its result).
	RegistryReads uint64 `json:"registryReads"`
	// NegativeHits are misses answered not found by the negative cache;
	// RateLimited those answered not found because the read budget
	// (ReadsPerSecond) was spent.
	NegativeHits uint64 `json:"negativeHits"`
	RateLimited  uint64 `json:"rateLimited"`
}

// Lookup resolves instance IDs to instances: from the mirror when it holds
// the ID (a map read), else from the registry with bounded retries, because
// an event can outrun the mirror. It is safe for concurrent use.
type Lookup struct {
	reg    *Registry
	mirror *Mirror // may be nil
	cfg    LookupConfig
	now    func() time.Time

	budget *tokenBucket

	negMu    sync.Mutex
	negative *expiry.Set // keys found absent, until NegativeTTL after

	hits, misses, fallbacks, failures, reads, negHits, limited atomic.Uint64
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
	return &Lookup{reg: reg, mirror: mirror, cfg: cfg, now: time.Now,
		budget: newTokenBucket(cfg.ReadsPerSecond, time.Now), negative: expiry.New(maxNegative)}, nil
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
		NegativeHits:  l.negHits.Load(),
		RateLimited:   l.limited.Load(),
	}
}

// Resolve returns the instance service/id. A mirror hit returns at once.
// On a miss it reads the registry up to Attempts times with exponential
// backoff, checking the mirror again before each retry, and gives up early
// when ctx ends. It returns an error wrapping ErrNotFound if the instance
// is not registered (also when the negative cache or the read budget says
// so: see LookupConfig), ErrInvalidInstance for an invalid service or ID
// (without retrying), or the last registry or ctx error.
func (l *Lookup) Resolve(ctx context.Context, service, id string) (Instance, error) {
	found, errs := l.ResolveEach(ctx, service, []string{id})
	return found[0], errs[0]
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
// ctx), so callers can tell an instance that is gone from an outage.
//
// Mirror hits are map reads. The misses share one retry schedule: each
// round reads the registry for every ID still missing (a few at a time,
// within the read budget), then waits the backoff once and asks the mirror
// again. So a list naming thousands of IDs nobody registered costs the
// backoff once, not once per ID, and afterwards only map reads (the
// negative cache).
func (l *Lookup) ResolveEach(ctx context.Context, service string, ids []string) (found []Instance, errs []error) {
	found = make([]Instance, len(ids))
	errs = make([]error, len(ids))
	missed := fromMirror(l, ids, found, func(id string) (Instance, bool) { return l.mirror.Get(service, id) })
	l.resolveMissed(ctx, service, ids, missed, found, errs)
	return found, errs
}

// ResolveServers is ResolveEach for a balancer: per ID, the instance's
// server (when errs[i] is nil). An instance the mirror holds is given as
// the mirror's own server, which a balancer keeps instead of a copy
// (balancer.SetServersShared) and nobody may modify; others are read as
// ResolveEach reads them, each server the caller's own.
func (l *Lookup) ResolveServers(ctx context.Context, service string, ids []string) (servers []*balancer.Server, errs []error) {
	servers = make([]*balancer.Server, len(ids))
	errs = make([]error, len(ids))
	missed := fromMirror(l, ids, servers, func(id string) (*balancer.Server, bool) { return l.mirror.Server(service, id) })
	if len(missed) == 0 {
		return servers, errs
	}
	found := make([]Instance, len(ids))
	l.resolveMissed(ctx, service, ids, missed, found, errs)
	for _, i := range missed {
		if errs[i] == nil {
			s := ServerOf(found[i])
			servers[i] = &s
		}
	}
	return servers, errs
}

// fromMirror sets out[i] to what get gives for ids[i] where the mirror
// holds it (a hit), and returns the positions of the others.
func fromMirror[T any](l *Lookup, ids []string, out []T, get func(id string) (T, bool)) (missed []int) {
	for i, id := range ids {
		if l.mirror != nil {
			if v, ok := get(id); ok {
				l.hits.Add(1)
				out[i] = v
				continue
			}
		}
		missed = append(missed, i)
	}
	return missed
}

// resolveMissed resolves ids[i] for the positions in missed, which the
// mirror did not hold: the negative cache, then rounds of registry reads
// (see ResolveEach).
func (l *Lookup) resolveMissed(ctx context.Context, service string, ids []string, missed []int, found []Instance, errs []error) {
	var pending []int
	for _, i := range missed {
		l.misses.Add(1)
		key, err := EncodeKey(service, ids[i])
		switch {
		case err != nil:
			errs[i] = err
			l.failures.Add(1)
		case l.negativeHit(key):
			errs[i] = fmt.Errorf("%w: %s/%s (recently not found)", ErrNotFound, service, ids[i])
			l.negHits.Add(1)
			l.failures.Add(1)
		default:
			pending = append(pending, i)
		}
	}
	backoff := l.cfg.InitialBackoff
	for attempt := 0; attempt < l.cfg.Attempts && len(pending) > 0; attempt++ {
		if attempt > 0 {
			if err := ctxutil.Sleep(ctx, backoff); err != nil {
				for _, i := range pending {
					errs[i] = fmt.Errorf("serverlist: resolve %s/%s: %w (last: %w)", service, ids[i], err, errs[i])
				}
				break
			}
			backoff = min(2*backoff, l.cfg.MaxBackoff)
			pending = l.mirrorCatchUp(service, ids, pending, found, errs)
		}
		pending = l.readRound(ctx, service, ids, pending, found, errs)
	}
	for _, i := range pending {
		// Absent after every attempt (not cut short by ctx): remembered,
		// so the next list naming it costs a map read.
		if errors.Is(errs[i], ErrNotFound) && ctx.Err() == nil {
			errs[i] = fmt.Errorf("%w: %s/%s after %d attempts", ErrNotFound, service, ids[i], l.cfg.Attempts)
			if key, err := EncodeKey(service, ids[i]); err == nil {
				l.remember(key)
			}
		}
		l.failures.Add(1)
	}
}

// errRateLimited marks a miss answered without a read because the budget
// was spent; it wraps ErrNotFound.
var errRateLimited = fmt.Errorf("%w: registry read budget spent", ErrNotFound)

// mirrorCatchUp drops from missed the IDs the mirror now holds.
func (l *Lookup) mirrorCatchUp(service string, ids []string, missed []int, found []Instance, errs []error) []int {
	if l.mirror == nil {
		return missed
	}
	still := missed[:0]
	for _, i := range missed {
		if in, ok := l.mirror.Get(service, ids[i]); ok {
			found[i], errs[i] = in, nil
			l.fallbacks.Add(1)
			continue
		}
		still = append(still, i)
	}
	return still
}

// readRound reads the registry for the missed IDs, a few at a time, and
// returns those still missing after it (not found, or the read failed).
// An ID without a read token fails for good this time, as not found.
func (l *Lookup) readRound(ctx context.Context, service string, ids []string, missed []int, found []Instance, errs []error) []int {
	var wg sync.WaitGroup
	sem := make(chan struct{}, resolveParallelism)
	retry := make([]bool, len(ids))
	for _, i := range missed {
		if !l.budget.take() {
			l.limited.Add(1)
			l.failures.Add(1)
			errs[i] = fmt.Errorf("%w: %s/%s", errRateLimited, service, ids[i])
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			actx, cancel := context.WithTimeout(ctx, l.cfg.AttemptTimeout)
			in, err := l.reg.Get(actx, service, ids[i])
			cancel()
			l.reads.Add(1)
			if err != nil {
				errs[i], retry[i] = err, true
				return
			}
			found[i], errs[i] = in, nil
			l.fallbacks.Add(1)
		})
	}
	wg.Wait()
	still := missed[:0]
	for _, i := range missed {
		switch {
		case retry[i] && ctx.Err() == nil:
			still = append(still, i)
		case retry[i]:
			// Cut short by ctx: the error says so, with the read's.
			errs[i] = fmt.Errorf("serverlist: resolve %s/%s: %w (last: %w)", service, ids[i], ctx.Err(), errs[i])
			l.failures.Add(1)
		}
	}
	return still
}

// negativeHit reports whether key was found absent within NegativeTTL.
func (l *Lookup) negativeHit(key string) bool {
	l.negMu.Lock()
	defer l.negMu.Unlock()
	return l.negative.Has(key, l.now())
}

// remember caches key as absent for NegativeTTL.
func (l *Lookup) remember(key string) {
	l.negMu.Lock()
	defer l.negMu.Unlock()
	now := l.now()
	l.negative.Add(key, now.Add(l.cfg.NegativeTTL), now)
}

// tokenBucket is a rate limit: rate tokens a second, at most rate stored.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64
	tokens float64
	last   time.Time
	now    func() time.Time
}

func newTokenBucket(rate int, now func() time.Time) *tokenBucket {
	return &tokenBucket{rate: float64(rate), tokens: float64(rate), last: now(), now: now}
}

// take takes a token if one is there.
func (b *tokenBucket) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.tokens = min(b.rate, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
