package balancer

import (
	"sync"
	"sync/atomic"
	"time"
)

// The coarse clock tells the time, to a millisecond, to the statistics
// that do not need better: the decay of an active-request count (minutes),
// the age of a zone decision (seconds), the end of a breaker's blackout
// (seconds). Reading the system's monotonic clock costs about 50 ns on a
// virtual machine, several times a whole pick, and a request read it twice
// (at the pick and at its end); the coarse clock costs one atomic load.
//
// One goroutine per process keeps it, and only while it is used: it ticks
// every coarseTick while picks read it, stops ticking after a tick in which
// nobody read it (an idle gateway pays nothing), and is woken by the next
// reader, which reads the system clock that once. It runs while at least
// one started balancer that uses the system clock is open (Balancer.Start
// acquires it, Close releases it), so it stops with the last of them. A
// balancer that was never started, or that has a clock of its own
// (WithClock: tests), reads its clock every time, as before.
//
// A coarse reading is at most one tick behind the system clock, plus the
// goroutine's scheduling delay on a saturated machine. Response times are
// never taken from it: a pick that times its request reads the system
// clock (see Balancer.Pick and WithoutPickTiming).

// coarseTick is the coarse clock's resolution.
const coarseTick = time.Millisecond

// processBase is the origin of the nanotimes of every balancer on the
// system clock, so that the coarse clock's readings are theirs.
var processBase = time.Now()

// sinceProcessBase is the system clock's monotonic nanotime.
func sinceProcessBase() int64 { return int64(time.Since(processBase)) }

type coarseClock struct {
	now     atomic.Int64 // sinceProcessBase at the last tick, while ticking
	ticking atomic.Bool
	read    atomic.Bool   // read since the last tick
	wake    chan struct{} // a reader found it idle

	mu    sync.Mutex // guards the fields below; held while it stops
	users int
	stop  chan struct{}
	done  chan struct{}
}

var coarse = &coarseClock{wake: make(chan struct{}, 1)}

// acquire counts a user; the first starts the goroutine.
func (c *coarseClock) acquire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users++
	if c.users == 1 {
		c.stop, c.done = make(chan struct{}), make(chan struct{})
		go c.run(c.stop, c.done)
	}
}

// release uncounts a user; the last stops the goroutine and waits for it.
func (c *coarseClock) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.users == 0 {
		close(c.stop)
		<-c.done
	}
}

// nanotime returns the coarse time, or the system clock's when the coarse
// clock is idle (and wakes it).
func (c *coarseClock) nanotime() int64 {
	if c.ticking.Load() {
		if !c.read.Load() {
			c.read.Store(true) // written once per tick, not per read
		}
		return c.now.Load()
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return sinceProcessBase()
}

// run waits for a reader, then ticks until a tick passes unread.
func (c *coarseClock) run(stop, done chan struct{}) {
	defer close(done)
	defer c.ticking.Store(false)
	for {
		select {
		case <-stop:
			return
		case <-c.wake:
		}
		c.now.Store(sinceProcessBase())
		c.read.Store(false)
		c.ticking.Store(true)
		t := time.NewTicker(coarseTick)
		for c.ticking.Load() {
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
				c.now.Store(sinceProcessBase())
				if !c.read.Swap(false) {
					c.ticking.Store(false) // a whole tick unread: idle
				}
			}
		}
		t.Stop()
	}
}
