package lbvisitor

// Following on demand: a table given a Follower (a scoped subscriber)
// follows, besides the configured services, those requests ask for (Want)
// and unfollows them once idle (the Janitor). A request for a service not
// followed yet waits, within bounds, for its first list; a request for a
// service the registry does not hold is answered unknown, and remembered
// so for a while, so that a flood of invented names costs a bounded
// amount of work and leaves nothing behind.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/base/expiry"
)

// Follower follows services on demand; a scoped *subscriber.Subscriber is
// one. Follow returns once the service's records are loaded, reporting
// whether the registry holds a routable instance of it; the service's
// first list then reaches Services.Handle. Unfollow stops following it.
// MayHold answers, cheaply, whether the registry may hold the service at
// all: false only when it surely holds nothing of it (see
// serverlist.Registry.MayHold), so that invented names cost no follow.
type Follower interface {
	Follow(ctx context.Context, service string) (found bool, err error)
	Unfollow(service string) (bool, error)
	MayHold(ctx context.Context, service string) (bool, error)
}

// Defaults of the on-demand follows (ServicesConfig).
const (
	// DefaultFollowTimeout bounds one on-demand follow: loading the
	// service's records and installing its first list.
	DefaultFollowTimeout = 5 * time.Second
	// DefaultNegativeTTL is how long a service found absent from the
	// registry is answered unknown without asking again.
	DefaultNegativeTTL = 2 * time.Second
	// DefaultMaxFollowing bounds the on-demand follows under way at once.
	DefaultMaxFollowing = 64
	// maxNegative bounds the names remembered absent.
	maxNegative = 10000
)

// ErrFollowBusy is returned (wrapping ErrUnknownService) by Want when
// MaxFollowing follows are under way already: a flood of requests for
// services not followed yet.
var ErrFollowBusy = fmt.Errorf("%w: too many services being followed at once", ErrUnknownService)

// FollowStats counts the on-demand follows of a table.
type FollowStats struct {
	// Follows counts the services followed on demand and routed; NotFound
	// the requested services the registry did not hold; Failed the follows
	// that failed or timed out; Busy the requests refused because
	// MaxFollowing follows were under way; NegativeHits the requests
	// answered from the memory of a service found absent.
	Follows      uint64 `json:"follows"`
	NotFound     uint64 `json:"notFound"`
	Failed       uint64 `json:"failed"`
	Busy         uint64 `json:"busy"`
	NegativeHits uint64 `json:"negativeHits"`
	// Unfollows counts the services the Janitor unfollowed (idle, or
	// empty); Following the follows under way now.
	Unfollows uint64 `json:"unfollows"`
	Following int    `json:"following"`
}

// following is the on-demand side of Services.
type following struct {
	follower    Follower
	timeout     time.Duration
	negativeTTL time.Duration
	max         int

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the follows under way

	// mu guards pending and negative. It is taken under a Visitor's lock
	// (publish, drop) and never held while another lock is taken.
	mu       sync.Mutex
	pending  map[string]*pendingFollow
	negative *expiry.Set // names found absent, until when they are answered unknown
	closed   bool

	follows, notFound, failed, busy, negHits atomic.Uint64
}

// pendingFollow is one follow under way; the requests for its service
// wait on done.
type pendingFollow struct {
	settled chan struct{} // closed when the service is published or dropped
	once    sync.Once
	done    chan struct{} // closed when the follow ended; then err is set
	err     error
}

func (p *pendingFollow) settle() { p.once.Do(func() { close(p.settled) }) }

func (f *following) init(cfg ServicesConfig) {
	f.follower = cfg.Follower
	f.timeout = cmpOr(cfg.FollowTimeout, DefaultFollowTimeout)
	f.negativeTTL = cmpOr(cfg.NegativeTTL, DefaultNegativeTTL)
	f.max = cmpOr(cfg.MaxFollowing, DefaultMaxFollowing)
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.pending = make(map[string]*pendingFollow)
	f.negative = expiry.New(maxNegative)
}

// cmpOr returns v, or def when v is not positive.
func cmpOr[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// Want returns the published service of name, following it first when the
// table has a Follower and does not follow it yet: it waits, within ctx
// and FollowTimeout, until the service's records are loaded and its first
// list is installed. A request that finds the service published returns
// at once (Lookup's cost). Without a Follower, or for a service the
// registry does not hold (remembered for NegativeTTL), an invalid name,
// or while MaxFollowing follows are under way (ErrFollowBusy), the error
// wraps ErrUnknownService; a failed or timed-out follow returns its error.
// Want marks the service requested.
func (s *Services) Want(ctx context.Context, name string) (*Service, error) {
	if sv := s.Lookup(name); sv != nil {
		sv.markRequested()
		return sv, nil
	}
	f := &s.following
	if f.follower == nil {
		return nil, ErrUnknownService
	}
	if err := events.ValidateService(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnknownService, err)
	}
	p, err := s.startFollow(name)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("lbvisitor: follow %s: %w", name, ctx.Err())
	}
	if p.err != nil {
		return nil, p.err
	}
	if sv := s.Lookup(name); sv != nil {
		sv.markRequested()
		return sv, nil
	}
	// Followed and unfollowed again between the two (an idle sweep).
	return nil, ErrUnknownService
}

// startFollow returns the follow under way for name, starting one if
// there is none. Under s.mu, so that the Janitor's Unfollow and a new
// follow of one service never interleave.
func (s *Services) startFollow(name string) (*pendingFollow, error) {
	f := &s.following
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv := s.Lookup(name); sv != nil { // published meanwhile
		p := &pendingFollow{done: make(chan struct{})}
		close(p.done)
		return p, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, ErrClosed
	}
	if p := f.pending[name]; p != nil {
		return p, nil
	}
	if f.negative.Has(name, time.Now()) {
		f.negHits.Add(1)
		return nil, fmt.Errorf("%w: %s: not in the registry", ErrUnknownService, name)
	}
	if len(f.pending) >= f.max {
		f.busy.Add(1)
		return nil, ErrFollowBusy
	}
	p := &pendingFollow{settled: make(chan struct{}), done: make(chan struct{})}
	f.pending[name] = p
	f.wg.Go(func() { s.runFollow(name, p) })
	return p, nil
}

// runFollow follows name for the requests waiting on p.
func (s *Services) runFollow(name string, p *pendingFollow) {
	f := &s.following
	ctx, cancel := context.WithTimeout(f.ctx, f.timeout)
	defer cancel()
	var found bool
	may, err := f.follower.MayHold(ctx, name)
	if err != nil || may {
		// An error (NATS away) is not a verdict: the follow tells.
		found, err = f.follower.Follow(ctx, name)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("lbvisitor: follow %s: %w", name, err)
	case !found:
		err = fmt.Errorf("%w: %s: not in the registry", ErrUnknownService, name)
	default:
		select {
		case <-p.settled:
			if s.Lookup(name) == nil {
				err = fmt.Errorf("lbvisitor: follow %s: its first list installed no server", name)
			}
		case <-ctx.Done():
			err = fmt.Errorf("lbvisitor: follow %s: waiting for its first list: %w", name, ctx.Err())
		}
	}

	s.mu.Lock()
	if err != nil && s.Lookup(name) == nil {
		// Give it up, under s.mu: a new follow of it starts afresh.
		if _, uerr := f.follower.Unfollow(name); uerr != nil {
			s.log.Debug().Err(uerr).Str("service", name).Msg("unfollow after a failed follow")
		}
	} else {
		err = nil
	}
	f.mu.Lock()
	delete(f.pending, name)
	switch {
	case err == nil:
		f.follows.Add(1)
	case !found && errors.Is(err, ErrUnknownService):
		f.notFound.Add(1)
		now := time.Now()
		f.negative.Add(name, now.Add(f.negativeTTL), now)
	default:
		f.failed.Add(1)
	}
	f.mu.Unlock()
	s.mu.Unlock()
	if err != nil {
		s.log.Debug().Err(err).Str("service", name).Msg("on-demand follow failed")
	} else {
		s.log.Info().Str("service", name).Msg("service followed on request")
	}
	p.err = err
	close(p.done)
}

// settled tells a follow under way that its service was published or
// dropped. Called under the service's Visitor's lock.
func (f *following) settled(name string) {
	if f.follower == nil {
		return
	}
	f.mu.Lock()
	p := f.pending[name]
	f.mu.Unlock()
	if p != nil {
		p.settle()
	}
}

// isPending reports whether a follow of name is under way.
func (f *following) isPending(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pending[name] != nil
}

// pin follows service for a watch, whether the registry holds it or
// not: it is published at once (with an empty list until its first
// pushed list), and the Follower follows it in the background, retried
// until it succeeds, the service is unfollowed, or the table closes.
func (s *Services) pin(name string) {
	if events.ValidateService(name) != nil {
		return // a name no list can carry: watched, never filled
	}
	if _, err := s.Follow(name); err != nil {
		s.log.Warn().Err(err).Str("service", name).Msg("watch: cannot build the service's balancer")
		return
	}
	f := &s.following
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.wg.Go(func() {
		backoff := 100 * time.Millisecond
		for {
			ctx, cancel := context.WithTimeout(f.ctx, f.timeout)
			_, err := f.follower.Follow(ctx, name)
			cancel()
			if err == nil || f.ctx.Err() != nil || s.Lookup(name) == nil {
				return
			}
			s.log.Warn().Err(err).Str("service", name).Dur("retry_in", backoff).Msg("watch: cannot follow the service yet")
			select {
			case <-f.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	})
}

// FollowStats returns the counters of the on-demand follows.
func (s *Services) FollowStats() FollowStats {
	f := &s.following
	f.mu.Lock()
	n := len(f.pending)
	f.mu.Unlock()
	return FollowStats{
		Follows: f.follows.Load(), NotFound: f.notFound.Load(), Failed: f.failed.Load(),
		Busy: f.busy.Load(), NegativeHits: f.negHits.Load(), Unfollows: s.removed.Load(), Following: n,
	}
}

// ErrClosed is returned by Want after Close.
var ErrClosed = errors.New("lbvisitor: services closed")

// Close ends the follows under way (their requests get an error) and
// waits for them. Call it before the Follower closes.
func (s *Services) Close() {
	f := &s.following
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	if f.cancel != nil {
		f.cancel()
	}
	f.wg.Wait()
}
