package balancer

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
)

// Rand is the randomness a balancer uses. The default is math/rand/v2's
// global source; tests inject a seeded one. Implementations must be safe
// for concurrent use.
type Rand interface {
	IntN(n int) int
	Float64() float64
}

type globalRand struct{}

func (globalRand) IntN(n int) int { return rand.IntN(n) }

func (globalRand) Float64() float64 { return rand.Float64() }

// intN returns r.IntN(n), n > 0. With the default randomness (no
// WithRand) the number comes straight from the runtime's per-thread
// generator, scaled by a multiplication: no interface call and no
// rejection loop, which cost as much as a whole round-robin pick. Its
// bias, n / 2^64, is nil in practice.
func intN(r Rand, n int) int {
	if _, global := r.(globalRand); global {
		hi, _ := bits.Mul64(rand.Uint64(), uint64(n))
		return int(hi)
	}
	return r.IntN(n)
}

// Option customises a Balancer.
type Option func(*Balancer) error

// WithClock sets the clock used by stats, breakers and caches.
func WithClock(c Clock) Option {
	return func(b *Balancer) error {
		if c == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidConfig)
		}
		b.shared.clock = c
		return nil
	}
}

// WithRand sets the source of randomness.
func WithRand(r Rand) Option {
	return func(b *Balancer) error {
		if r == nil {
			return fmt.Errorf("%w: nil rand", ErrInvalidConfig)
		}
		b.rnd = r
		return nil
	}
}

// WithRule sets a rule instance, overriding Config.Rule: a rule of this
// package built with its own settings, or a custom one written anywhere
// (see Rule for what it receives and its threading rules).
func WithRule(r Rule) Option {
	return func(b *Balancer) error {
		if r == nil {
			return fmt.Errorf("%w: nil rule", ErrInvalidConfig)
		}
		b.rule = r
		return nil
	}
}

// WithPinger sets the liveness check, overriding Config.Ping.Kind. A nil
// Pinger or NoOpPing means no ping loop.
func WithPinger(p Pinger) Option {
	return func(b *Balancer) error {
		b.pinger = p
		return nil
	}
}

// WithoutPickTiming makes the balancer leave the timing of requests to its
// caller: a Pick reports the response time it measured itself
// (DoneInfo.ResponseTime, or Responded's argument), and one reported as
// zero records none. The pick and its end then read no system clock,
// which costs about 50 ns on a virtual machine, twice a request, more
// than the pick itself: the statistics that need no better than a
// millisecond (active-request decay, zone decisions, breakers) read the
// coarse clock of a started balancer instead. Use it when every outcome
// carries its response time, or when response times are not wanted (no
// rule that reads them: WeightedResponseTime, or a rule of your own).
func WithoutPickTiming() Option {
	return func(b *Balancer) error {
		b.shared.timed = false
		return nil
	}
}

// WithServerList sets the source a polling updater reads the list from.
// Without it, a balancer whose config has ListOfServers uses that static
// list; otherwise it has no updater and is fed by SetServers (the push path).
func WithServerList(l ServerList) Option {
	return func(b *Balancer) error {
		b.source = l
		return nil
	}
}
