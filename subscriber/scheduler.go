package subscriber

// The coalescing scheduler: when each service's live list is delivered.
// What a delivery hands out (the table's live list, the ListChanged
// revision, the Handler call) is the subscriber's (subscriber.go).

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// scheduler decides when each service's list is delivered. A change marks
// the service dirty; the first change after a quiet period is delivered at
// once, later ones at most once per coalescing window, changes made while
// a delivery runs go out together after it, and a failed delivery is
// retried after a backoff (100 ms doubling to 5 s).
//
// Threading: mu guards svcs, svcsPeak, ready and stopped, and every
// svcState. mark, start and stop may be called from any goroutine, with or
// without the subscriber's locks held: mu is taken last, and no other lock
// is taken and no callback runs while it is held. Each delivery runs send
// on a goroutine of its own (a new one, or its timer's; start's batch on
// a few workers), without mu, at most one per service at a time. Every
// delivery scheduled or running holds one count of wg, so that the
// subscriber's Close, which stops the scheduler and then waits on wg,
// returns only once every send has.
type scheduler struct {
	coalesce      time.Duration   // Config.Coalesce; zero or negative: no window
	ctx           context.Context // ends at Close: a failure after it is not retried
	wg            *sync.WaitGroup // the subscriber's
	log           zerolog.Logger
	handlerErrors *atomic.Uint64 // Stats.HandlerErrors

	// send delivers the service's current list and reports whether the
	// table still knows the service, and the Handler's error.
	send func(service string) (known bool, err error)

	mu       sync.Mutex
	svcs     map[string]*svcState
	svcsPeak int  // len(svcs) at its largest since it was last copied
	ready    bool // start was called: deliveries may begin
	stopped  bool
}

// svcState is the delivery state of one service.
type svcState struct {
	dirty, running bool
	timer          *time.Timer
	lastFire       time.Time
	failures       int
}

// mark records a change of service and schedules its delivery once the
// scheduler has started. A service that is not confirmed (see
// Subscriber.markDirty) and has no delivery state is not marked.
func (sc *scheduler) mark(service string, confirmed bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !confirmed && sc.svcs[service] == nil {
		return
	}
	st := sc.stateLocked(service)
	st.dirty = true
	if sc.ready && !sc.stopped {
		sc.scheduleLocked(service, st)
	}
}

// startWorkers bounds the deliveries of start's batch that run at once.
// The batch is every service the registry held at start (1,000 at once in
// docs/perf.md's fleet): delivered all together, each holding its lookups'
// results and its new servers until its balancer took them, they raised
// the gateway's heap at start by some 15 MB against the same deliveries a
// few at a time, for no gain in time (the work is CPU-bound: more
// deliveries at once than cores only interleave). Later changes are
// delivered as they come, each on a goroutine of its own.
var startWorkers = max(4, 2*runtime.GOMAXPROCS(0))

// reoffer delivers the list of a service whose delivery waits for the
// backoff of a failure or a deferral as soon as the coalescing window
// allows: the backoff is cancelled. A service without delivery state, or
// not waiting, is left alone.
func (sc *scheduler) reoffer(service string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	st := sc.svcs[service]
	if st == nil || st.failures == 0 {
		return
	}
	st.failures = 0
	st.dirty = true
	if st.timer != nil && st.timer.Stop() {
		st.timer = nil
		sc.wg.Done()
	}
	if sc.ready && !sc.stopped {
		sc.scheduleLocked(service, st)
	}
}

// start marks the known services dirty and lets deliveries begin: those
// and every service marked meanwhile are delivered now, in the order of
// known, by at most startWorkers goroutines.
func (sc *scheduler) start(known []string) {
	sc.mu.Lock()
	sc.ready = true
	for _, svc := range known {
		sc.stateLocked(svc).dirty = true
	}
	batch := make([]queued, 0, len(sc.svcs))
	for _, svc := range known {
		batch = sc.takeLocked(batch, svc)
	}
	for svc := range sc.svcs {
		batch = sc.takeLocked(batch, svc)
	}
	sc.mu.Unlock()
	sc.deliverBatch(batch)
}

// queued is a delivery of start's batch.
type queued struct {
	service string
	st      *svcState
}

// takeLocked appends service to batch if a delivery of it is due now:
// what scheduleLocked does then, the goroutine left to the batch's
// workers. Called with mu held.
func (sc *scheduler) takeLocked(batch []queued, service string) []queued {
	st := sc.svcs[service]
	if st == nil || !st.dirty || st.running || st.timer != nil || sc.stopped {
		return batch // absent, taken already, or not due
	}
	sc.wg.Add(1)
	st.running, st.dirty = true, false
	return append(batch, queued{service, st})
}

// deliverBatch delivers each of batch (marked running and counted in wg)
// on at most startWorkers goroutines, also counted in wg while they run.
// It does not wait for them. Deliveries not begun when the scheduler
// stops are dropped.
func (sc *scheduler) deliverBatch(batch []queued) {
	var next atomic.Int64
	workers := min(startWorkers, len(batch))
	sc.wg.Add(workers)
	for range workers {
		go func() {
			defer sc.wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(batch) {
					return
				}
				if q := batch[i]; !sc.dropIfStopped(q.st) {
					sc.deliver(q.service, q.st)
				}
			}
		}()
	}
}

// dropIfStopped ends a queued delivery without running it once the
// scheduler stopped, and reports whether it did.
func (sc *scheduler) dropIfStopped(st *svcState) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !sc.stopped {
		return false
	}
	st.running = false
	sc.wg.Done()
	return true
}

// stop schedules nothing more and cancels the deliveries waiting on their
// timer; those running finish (the caller waits on wg).
func (sc *scheduler) stop() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.stopped = true
	for _, st := range sc.svcs {
		if st.timer != nil && st.timer.Stop() {
			st.timer = nil
			sc.wg.Done()
		}
	}
}

// forget drops the delivery state of service (an unfollowed service):
// a delivery waiting on its timer is cancelled; one running ends as it
// would for a service the table forgot.
func (sc *scheduler) forget(service string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	st := sc.svcs[service]
	if st == nil {
		return
	}
	st.dirty, st.failures = false, 0
	if st.timer != nil && st.timer.Stop() {
		st.timer = nil
		sc.wg.Done()
	}
	if !st.running && st.timer == nil {
		delete(sc.svcs, service)
	}
}

func (sc *scheduler) stateLocked(service string) *svcState {
	st := sc.svcs[service]
	if st == nil {
		st = &svcState{}
		sc.svcs[service] = st
		sc.svcsPeak = max(sc.svcsPeak, len(sc.svcs))
	}
	return st
}

// scheduleLocked starts a delivery now or when the coalescing window (or
// the error backoff) allows. Called with mu held.
func (sc *scheduler) scheduleLocked(service string, st *svcState) {
	if st.running || st.timer != nil || sc.stopped {
		return
	}
	var delay time.Duration
	if st.failures > 0 {
		delay = min(100*time.Millisecond<<min(st.failures-1, 6), 5*time.Second)
	} else if sc.coalesce > 0 && !st.lastFire.IsZero() {
		delay = time.Until(st.lastFire.Add(sc.coalesce))
	}
	sc.wg.Add(1)
	if delay <= 0 {
		st.running, st.dirty = true, false
		go sc.deliver(service, st)
		return
	}
	st.timer = time.AfterFunc(delay, func() {
		sc.mu.Lock()
		st.timer = nil
		if sc.stopped {
			sc.mu.Unlock()
			sc.wg.Done()
			return
		}
		st.running, st.dirty = true, false
		sc.mu.Unlock()
		sc.deliver(service, st)
	})
}

// deliver runs send for the service, then schedules it again if it
// changed meanwhile or the Handler failed.
func (sc *scheduler) deliver(service string, st *svcState) {
	defer sc.wg.Done()
	known, err := sc.send(service)

	sc.mu.Lock()
	defer sc.mu.Unlock()
	st.running = false
	st.lastFire = time.Now()
	switch {
	case err != nil && sc.ctx.Err() == nil && errors.Is(err, ErrDeferred):
		// The handler holds the list back on purpose: offered again
		// after the same backoff, neither counted nor logged as a failure.
		st.failures++
		st.dirty = true
	case err != nil && sc.ctx.Err() == nil:
		sc.handlerErrors.Add(1)
		st.failures++
		st.dirty = true
		sc.log.Warn().Err(err).Str("service", service).Int("failures", st.failures).Msg("list handler failed; will retry")
	default:
		st.failures = 0
	}
	if st.dirty {
		sc.scheduleLocked(service, st)
		return
	}
	if !known && err == nil && st.timer == nil {
		// The table forgot the service and its last (empty) list went out:
		// its delivery state goes too, so that services that come and go
		// do not accumulate.
		delete(sc.svcs, service)
		if sc.svcsPeak >= shrinkMin && len(sc.svcs) <= sc.svcsPeak/4 {
			sc.svcs, sc.svcsPeak = copyMap(sc.svcs), len(sc.svcs)
		}
	}
}
