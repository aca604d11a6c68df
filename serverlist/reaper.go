package serverlist

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// DefaultSweepInterval is the pace of a leading reaper's sweep for records
// that have no lease (see [Reaper]).
const DefaultSweepInterval = 5 * time.Minute

// ReaperConfig configures [NewReaper]. The zero value is usable.
type ReaperConfig struct {
	// Node names this reaper in the lock while it leads. Empty means
	// "<hostname>-<pid>".
	Node string
	// SweepInterval is how often the leader lists the records to find those
	// that have no lease (a publisher that died between its record and its
	// lease, or leases that ran out while no reaper led). A record found
	// without a lease at two sweeps in a row, unchanged, is removed. The
	// first sweep after taking the lead follows the initial one after one
	// TTL. Zero means DefaultSweepInterval.
	SweepInterval time.Duration
	// Logger receives elections, removals and failures. The zero value logs
	// nothing.
	Logger zerolog.Logger
	// Mirror, when set, is a mirror of the same bucket (a gateway's own):
	// once it is synced, a sweep takes the records from it instead of
	// listing every record again, and lists the leases of its services
	// a batch of services at a time (sweepBatch), so that the messages
	// queued for the leader stay few. Nil: every sweep lists the bucket.
	Mirror *Mirror
	// OnLead, when set, runs in a goroutine of its own for each term this
	// reaper leads, with a context that ends with the term; the term waits
	// for it to return before the next election. A region's Replicator
	// runs so (Replicator.Lead): one process of the region at a time.
	OnLead func(ctx context.Context)
}

// ReaperStats count what a reaper did. Safe to read at any time.
type ReaperStats struct {
	// Leader reports whether this reaper leads now.
	Leader bool `json:"leader"`
	// Terms counts the times it took the lead.
	Terms uint64 `json:"terms"`
	// LeasesEnded counts the lease removals and expiries it saw while
	// leading.
	LeasesEnded uint64 `json:"leasesEnded"`
	// Reaped counts the records it removed.
	Reaped uint64 `json:"reaped"`
	// Sweeps counts its sweeps for records without a lease.
	Sweeps uint64 `json:"sweeps"`
	// MirroredSweeps counts the sweeps that took the records from the
	// mirror (ReaperConfig.Mirror) instead of listing them.
	MirroredSweeps uint64 `json:"mirroredSweeps"`
	// Errors counts failed watches, reads and removals.
	Errors uint64 `json:"errors"`
	// NotPermitted reports that the NATS account may not write the lock:
	// this process cannot reap and does not try again until restarted. It
	// watches the lock instead, to tell when no reaper leads.
	NotPermitted bool `json:"notPermitted"`
	// Unled reports, for a reaper that may not lead, that no reaper has
	// held the lock for more than a TTL: crashed instances are not being
	// removed (a warning is logged when it becomes true).
	Unled bool `json:"unled"`
}

// Reaper turns the end of a lease into the removal of its record, for the
// records written by [Registry.Claim], which never age out by themselves.
//
// Many processes may run a Reaper over one bucket (every gateway does by
// default): they elect one leader with a create-only write of
// [ReaperLockKey], which the leader renews at a third of the TTL and which
// ages out with the bucket's TTL when the leader dies; the others watch the
// lock key alone. The leader consumes the leases' expiry signals
// (lease_schedule.go): one message per lease that was not renewed for a
// lease, none per renewal. For each, unless the lease was renewed after the
// signal, it ends the lease (conditionally on its revision, so a renewal
// racing it wins) and removes the record if it was written before the
// signal, conditionally on its revision, so a record rewritten by a new
// holder is never removed. Plain leases (a bucket that cannot schedule,
// publishers of an earlier release) have no signal: while there are any,
// the leader also watches every lease write, as before scheduled leases,
// and removes the record of a lease that was removed or ran out. Its sweeps
// remove records that have had no lease for a whole sweep interval, and
// tell whether plain leases remain.
//
// A process whose NATS account may not write the lock (a gateway with
// read-only permissions) logs it once and stays out of the election; see
// docs/security.md for the reaper's permissions.
type Reaper struct {
	reg *Registry
	cfg ReaperConfig
	log zerolog.Logger

	leader, notPermitted, unled                    atomic.Bool
	terms, leasesEnded, reaped, sweeps, errorsSeen atomic.Uint64
	mirroredSweeps                                 atomic.Uint64
	plainMessages                                  atomic.Uint64
	// leasePurgeRefused: the account may not end leases (scheduled path).
	leasePurgeRefused atomic.Bool

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewReaper returns a reaper over reg. It starts nothing until Start.
func NewReaper(reg *Registry, cfg ReaperConfig) *Reaper {
	if cfg.Node == "" {
		cfg.Node = defaultNode()
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	return &Reaper{reg: reg, cfg: cfg, log: cfg.Logger}
}

// Start runs the reaper in a goroutine until Close. It returns at once.
func (r *Reaper) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return errors.New("serverlist: reaper already started")
	}
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		r.run(ctx)
	}()
	return nil
}

// Close stops the reaper and waits for its goroutine; a leader gives the
// lock up, so another reaper takes the lead at once. Idempotent.
func (r *Reaper) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	<-r.done
	r.cancel = nil
	return nil
}

// Leader reports whether this reaper leads now.
func (r *Reaper) Leader() bool { return r.leader.Load() }

// PlainMessages counts the lease writes and removals this reaper received
// while leading on the plain path (leases without an expiry signal): every
// renewal of such a lease is one. Zero while every lease is scheduled.
func (r *Reaper) PlainMessages() uint64 { return r.plainMessages.Load() }

// Stats returns the reaper's counters.
func (r *Reaper) Stats() ReaperStats {
	return ReaperStats{
		Leader: r.leader.Load(), Terms: r.terms.Load(), LeasesEnded: r.leasesEnded.Load(),
		Reaped: r.reaped.Load(), Sweeps: r.sweeps.Load(), MirroredSweeps: r.mirroredSweeps.Load(), Errors: r.errorsSeen.Load(),
		NotPermitted: r.notPermitted.Load(), Unled: r.unled.Load(),
	}
}

const (
	// reaperRetry is the wait after a failure before the next attempt.
	reaperRetry = time.Second
	// lockWriteTimeout bounds a write of the lock.
	lockWriteTimeout = 2 * time.Second
)

// failed counts err and returns the warning to log it with, unless ctx
// ended: the error of a reaper that stops is neither counted nor logged
// (zerolog's nil event logs nothing).
func (r *Reaper) failed(ctx context.Context, err error) *zerolog.Event {
	if ctx.Err() != nil {
		return nil
	}
	r.errorsSeen.Add(1)
	return r.log.Warn().Err(err)
}

// defaultNode names this process in a lock or a status:
// "<hostname>-<pid>".
func defaultNode() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid())
}
