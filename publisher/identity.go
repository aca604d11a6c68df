package publisher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// newOwner returns a random token naming this publisher in its record.
func newOwner() string {
	b := make([]byte, 12)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// Owner returns the token that names this publisher in its registry record
// (serverlist.Instance.Owner).
func (p *Publisher) Owner() string { return p.owner }

// Replaced is closed once a newer process replaced the instance: the lease
// loop found the record under another owner with a later incarnation (a
// process started with Config.Replace). The publisher has then stopped
// refreshing, and yields for good: it does not fight for the ID. The
// caller should stop serving as this instance (announce exits with status
// 1). ReplacedBy tells by whom.
func (p *Publisher) Replaced() <-chan struct{} { return p.replaced }

// ReplacedBy returns the record of the process that replaced this one, once
// Replaced is closed.
func (p *Publisher) ReplacedBy() (serverlist.Instance, bool) {
	in := p.replacedBy.Load()
	if in == nil {
		return serverlist.Instance{}, false
	}
	return in.Clone(), true
}

// claim claims the instance's ID (serverlist.Registry.Claim). A record of
// another owner is refused at once when its holder answers a probe (see
// holderAnswers), else watched. A bucket that is gone is recreated first,
// when this process may create it; otherwise the claim fails until a
// gateway recreates it.
func (p *Publisher) claim(ctx context.Context, in serverlist.Instance, replace bool) (serverlist.Claimed, error) {
	opts := serverlist.ClaimOptions{Replace: replace, Probe: p.cfg.ClaimProbe, OnProbe: p.cfg.OnClaimWait, HolderAnswers: p.holderAnswers(in)}
	c, err := p.reg.Claim(ctx, in, opts)
	if err == nil || c.Record != 0 || errors.Is(err, serverlist.ErrInUse) || errors.Is(err, serverlist.ErrInvalidInstance) {
		return c, err
	}
	if created, eerr := p.reg.Ensure(ctx); eerr == nil && created {
		return p.reg.Claim(ctx, in, opts)
	}
	return c, err
}

// ClaimWait is the longest Announce watches a record of another owner for
// a renewal before it presumes its holder dead and takes the ID over
// (Config.ClaimProbe, or half the registry's TTL; see
// serverlist.Registry.ClaimWait). A caller that bounds Announce with a
// timeout gives it this on top of the time of its network operations, or
// the restart of a crashed instance fails instead of taking its ID over.
func (p *Publisher) ClaimWait() time.Duration {
	return p.reg.ClaimWait(serverlist.ClaimOptions{Probe: p.cfg.ClaimProbe})
}

// supersededError reports that a newer process holds the instance's ID.
type supersededError struct{ by serverlist.Instance }

func (e *supersededError) Error() string {
	return fmt.Sprintf("replaced by owner %q at %s (incarnation %d)", e.by.Owner, e.by.Addr(), e.by.Incarnation)
}

// leaseState is what the lease loop holds: the revisions of the record and
// of the lease it last wrote, and the refreshes since it last read the
// record back.
type leaseState struct {
	serverlist.Claimed
	sinceCheck int
	// moved says the record names a connection this publisher no longer
	// has (it reconnected): the next re-announcement rewrites it.
	moved bool
}

// connectionOf returns nc's identity as its server reports it (the
// server's ID and the client ID it gave the connection), or the zero
// Connection while nc is not connected or the server reports no client ID.
func connectionOf(nc *nats.Conn) serverlist.Connection {
	id, err := nc.GetClientID()
	if err != nil {
		return serverlist.Connection{}
	}
	return serverlist.Connection{ServerID: nc.ConnectedServerId(), ClientID: id}
}

// recordCheckEvery is how many lease refreshes pass between two reads of
// the record: a record removed or overwritten while the lease lives (by an
// operator, or a forged write) is re-asserted within this many intervals.
const recordCheckEvery = 3

// assert renews the lease (a compare-and-set), and re-asserts the record
// when the lease or the record is not this publisher's any more: removed
// (withdrawn, expired and reaped, purged, the bucket lost) or overwritten
// by another owner. It returns a *supersededError when a newer process
// holds the ID.
func (p *Publisher) assert(ctx context.Context, in serverlist.Instance, st *leaseState) error {
	next, err := p.reg.RefreshLease(ctx, in.Service, in.InstanceID, in.Owner, st.Lease)
	if err != nil && !errors.Is(err, serverlist.ErrRevisionMismatch) {
		// No verdict: NATS is away, or the bucket is gone.
		if created, eerr := p.reg.Ensure(ctx); eerr != nil || !created {
			return err
		}
		return p.reassert(ctx, in, st)
	}
	if err == nil {
		st.Lease = next
		if st.sinceCheck++; st.sinceCheck < recordCheckEvery {
			return nil
		}
	}
	// The lease is not ours any more, or it is time to read the record back.
	st.sinceCheck = 0
	held, err := p.reg.GetEntry(ctx, in.Service, in.InstanceID)
	if err == nil && held.Owner == in.Owner && held.Revision == st.Record {
		if st.Lease == next && next != 0 {
			return nil
		}
		// The lease ran out (a pause longer than the TTL) or was ended, but
		// the record is still ours: start it again.
		lease, err := p.reg.PutLease(ctx, in.Service, in.InstanceID, in.Owner)
		if err == nil {
			st.Lease = lease
		}
		return err
	}
	if err != nil && !errors.Is(err, serverlist.ErrNotFound) && !errors.Is(err, serverlist.ErrInvalidInstance) {
		return err
	}
	return p.reassert(ctx, in, st)
}

// reassert reads the record and takes it back, as memberlist refutes a
// suspicion, unless a newer process legitimately replaced this one.
func (p *Publisher) reassert(ctx context.Context, in serverlist.Instance, st *leaseState) error {
	log := p.log.Warn().Str("service", in.Service).Str("id", in.InstanceID).Int64("incarnation", in.Incarnation)
	held, err := p.reg.GetEntry(ctx, in.Service, in.InstanceID)
	switch {
	case err == nil && held.Owner == in.Owner:
		// Our own write, whose answer was lost: nothing happened.
		log = nil
	case err == nil && serverlist.Superseded(in, held.Instance, time.Now()):
		return &supersededError{by: held.Instance}
	case err == nil:
		log = log.Str("by_owner", held.Owner).Str("by_addr", held.Addr()).Int64("by_incarnation", held.Incarnation)
		log.Msg("the instance's registry record was overwritten by another owner (an older or forged registration); re-asserting it")
	case errors.Is(err, serverlist.ErrNotFound):
		log.Msg("the instance's registry record was removed while it lives (deregistered, expired, purged or the bucket lost); re-asserting it")
	case errors.Is(err, serverlist.ErrInvalidInstance):
		log.Err(err).Msg("the instance's registry record was overwritten with a malformed value; re-asserting it")
	default:
		return err
	}
	c, err := p.reg.Claim(ctx, in, serverlist.ClaimOptions{Replace: true})
	if c.Record != 0 {
		st.Claimed = c
	}
	return err
}

// yield gives the ID up to the process that replaced this one.
func (p *Publisher) yield(in serverlist.Instance, by serverlist.Instance) {
	p.replacedOnce.Do(func() {
		p.replacedBy.Store(&by)
		p.log.Error().Str("service", in.Service).Str("id", in.InstanceID).Int64("incarnation", in.Incarnation).
			Str("by_owner", by.Owner).Str("by_addr", by.Addr()).Int64("by_incarnation", by.Incarnation).
			Msg("replaced by a newer process for this instance ID; yielding: no more refreshes")
		close(p.replaced)
	})
}

// noteConnection records in in the connection the publisher has now, and
// in st that the record must be rewritten when it names another: the
// connection's advisory of a crash would name the new one, which no record
// would name.
func (p *Publisher) noteConnection(in *serverlist.Instance, st *leaseState) {
	if c := connectionOf(p.nc); !c.IsZero() && c != in.Connection() {
		in.NATSServerID, in.NATSClientID = c.ServerID, c.ClientID
		st.moved = true
	}
}

// rewriteConnection rewrites the record when it names a connection the
// publisher no longer has (reassert writes it in place while it is this
// publisher's), and reports whether it did. Failures are left to the
// re-announcement, which tries again.
func (p *Publisher) rewriteConnection(ctx context.Context, in *serverlist.Instance, st *leaseState) bool {
	if p.noteConnection(in, st); !st.moved {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.LeaseInterval)
	defer cancel()
	if err := p.reassert(rctx, *in, st); err != nil {
		return false
	}
	st.moved = false
	return true
}

// reannounceDelay is the least wait between a reconnect and the
// re-announcement; a random extra of up to as much again is added.
const reannounceDelay = 100 * time.Millisecond

// reannounceMaxBackoff caps the wait between failed re-announcements: a
// quarter of the lease interval. The registry comes back at a moment the
// publisher cannot know (a stream's new leader, elected 4-9 s after the
// old one was cut off), and a lease renewed last one interval before the
// fault ends two intervals after it: waits doubled up to a whole interval
// could overshoot that end by most of an interval, and the record be
// reaped while its instance lives (a 12 s lease, a partition: re-announced
// 13.6 s after the cut). A quarter lands within that of the registry's
// return; the cost is four failed attempts per interval while the
// registry stays away, each answered at once (no responders) or timed out.
func reannounceMaxBackoff(interval time.Duration) time.Duration {
	return max(interval/4, 100*time.Millisecond)
}

// lease refreshes the record every LeaseInterval, re-asserting it when it
// was removed or overwritten, and re-announces (record, then online event)
// after a reconnect or a failed refresh, with backoff. rev is the record's
// revision after the announcement. It ends when ctx does, or when a newer
// process replaced the instance.
func (p *Publisher) lease(ctx context.Context, in serverlist.Instance, st leaseState, done chan struct{}) {
	defer close(done)
	refresh := time.NewTicker(p.cfg.LeaseInterval)
	defer refresh.Stop()
	// The connection tells of reconnects itself, as the registry mirror
	// hears of them: no polling.
	connected := p.nc.StatusChanged(nats.CONNECTED)
	defer p.nc.RemoveStatusListener(connected)
	var retry <-chan time.Time // armed while a re-announcement is due
	backoff := 100 * time.Millisecond
	log := func() *zerolog.Event { return p.log.Warn().Str("service", in.Service).Str("id", in.InstanceID) }
	for {
		select {
		case <-ctx.Done():
			return
		case <-refresh.C:
			// In a cluster, half an interval: a server that cannot write
			// (a node cut from the quorum) is left in time (leaveServer).
			// One server alone gets the whole interval, which a renewal
			// that recreates a lost bucket may need.
			timeout := p.cfg.LeaseInterval
			if len(p.nc.Servers()) > 1 {
				timeout /= 2
			}
			rctx, cancel := context.WithTimeout(ctx, timeout)
			err := p.assert(rctx, in, &st)
			cancel()
			var sup *supersededError
			switch {
			case errors.As(err, &sup):
				p.yield(in, sup.by)
				return
			case err != nil && ctx.Err() == nil:
				log().Err(err).Stringer("retry_in", backoff).Msg("lease refresh failed")
				if retry == nil {
					retry = time.After(backoff)
				}
				p.leaveServer(err)
			}
			continue
		case _, ok := <-connected:
			if !ok {
				connected = nil // the connection is closed for good
				continue
			}
			// The record names the old connection: rewrite it at once, so
			// that the advisory of the new connection's end (a crash right
			// after the reconnect) names it. A failure is retried with the
			// re-announcement.
			if p.rewriteConnection(ctx, &in, &st) {
				p.log.Debug().Str("service", in.Service).Str("id", in.InstanceID).Uint64("nats_client_id", in.NATSClientID).Msg("record names the new connection")
			}
			// Re-announce shortly, not at once: after a server restart every
			// client reconnects, and gateways must have resubscribed to hear
			// the event; the jitter spreads the instances' re-announcements.
			backoff = 100 * time.Millisecond
			retry = time.After(reannounceDelay + mathrand.N(reannounceDelay))
			continue
		case <-retry:
		}
		rctx, cancel := context.WithTimeout(ctx, p.cfg.LeaseInterval)
		var err error
		if p.noteConnection(&in, &st); st.moved {
			if err = p.reassert(rctx, in, &st); err == nil {
				st.moved = false
			}
		} else {
			err = p.assert(rctx, in, &st)
		}
		if err == nil {
			err = p.publish(rctx, in, events.Online, "")
		}
		cancel()
		var sup *supersededError
		if errors.As(err, &sup) {
			p.yield(in, sup.by)
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				log().Err(err).Stringer("retry_in", backoff).Msg("re-announce failed")
			}
			retry = time.After(backoff)
			backoff = min(2*backoff, reannounceMaxBackoff(p.cfg.LeaseInterval))
			continue
		}
		retry, backoff = nil, 100*time.Millisecond
		p.log.Info().Str("service", in.Service).Str("id", in.InstanceID).Msg("re-announced")
	}
}

// leaveServer moves the connection to another server of its cluster when
// err, a failed renewal, says the registry did not answer through this
// one: a node cut from its cluster by a partition still answers its
// clients' pings, so nothing else would move them before the lease ends.
// The reconnect then re-announces the instance (lease). A connection that
// knows one server stays: reconnecting to it would change nothing.
func (p *Publisher) leaveServer(err error) {
	if !registryUnanswered(err) || len(p.nc.Servers()) < 2 {
		return
	}
	server := p.nc.ConnectedUrlRedacted()
	if ferr := p.nc.ForceReconnect(); ferr == nil {
		p.log.Warn().Err(err).Str("server", server).
			Msg("the registry does not answer through this NATS server: moving to another server of the cluster")
	}
}

// registryUnanswered reports whether err is a registry request that got
// no answer (a timeout, no responders), not a refusal.
func registryUnanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}
