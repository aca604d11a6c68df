package pushlb

// The client's fail-over: a NATS server cut from the rest of its cluster
// (a route partition) keeps its clients' connections and answers their
// pings, so nats.go never leaves it, while nothing reaches the client
// through it any more: no event, no registry change, no answer from the
// registry stream. The client then serves its last lists for as long as
// the partition lasts. The fail-over asks the registry stream through the
// connection at every ping interval; when it goes unanswered
// failoverMisses times in a row, the client moves to another server of
// its cluster (nats.go ForceReconnect), as a dead link is left, and the
// reconnect resyncs the mirror (serverlist.Mirror: a reconnect starts a
// fresh watch) and the subscriptions. The publisher leaves such a server
// the same way when a lease renewal goes unanswered (publisher's
// leaveServer).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/base/natsping"
)

// failoverMisses is how many probes in a row must go unanswered before the
// client moves: a stream's election after its leader's loss (a few
// seconds) is not a partition.
const failoverMisses = 3

// failoverMaxHold caps the misses required before a further move while
// the registry stays unanswered wherever the client goes (the cluster lost
// its quorum: moving does not help, and each move costs a resync).
const failoverMaxHold = 8 * failoverMisses

// errNoQuorum is a probe answered by a server that cannot reach a quorum
// of the stream's replicas: it knows no leader, or it is a leader that no
// longer hears from its peers.
var errNoQuorum = errors.New("pushlb: the registry stream has no leader with a quorum of its replicas through this server")

// failover probes the registry stream through the client's connection and
// moves the connection to another server of its cluster when the stream
// stops answering there. It runs one goroutine, from start to close.
type failover struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	every  time.Duration // the probe's interval, and its timeout
	log    zerolog.Logger

	answered, unanswered, moves atomic.Uint64

	stop chan struct{}
	done chan struct{}
}

// newFailover returns the fail-over of nc for the registry bucket's stream
// (KV_<bucket>). It probes at nc's ping interval (natsping.DefaultInterval
// at most): a server that answers pings but not the registry is left about
// as soon as a dead one would be.
func newFailover(nc *nats.Conn, js jetstream.JetStream, bucket string, log zerolog.Logger) *failover {
	every := nc.Opts.PingInterval
	if every <= 0 || every > natsping.DefaultInterval {
		every = natsping.DefaultInterval
	}
	return &failover{
		nc: nc, js: js, stream: "KV_" + bucket, every: every, log: log,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// start starts the probes.
func (f *failover) start() { go f.run() }

// close stops the probes and waits for the goroutine. It is idempotent.
func (f *failover) close() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
}

// stats returns the counters.
func (f *failover) stats() FailoverStats {
	return FailoverStats{Answered: f.answered.Load(), Unanswered: f.unanswered.Load(), Moves: f.moves.Load()}
}

func (f *failover) run() {
	defer close(f.done)
	t := time.NewTicker(f.every)
	defer t.Stop()
	misses, need := 0, failoverMisses
	server := f.nc.ConnectedServerId()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		// A connection that knows one server has nowhere to go; one that
		// is reconnecting or went elsewhere starts counting again.
		if f.nc.Status() != nats.CONNECTED || len(f.nc.Servers()) < 2 {
			misses = 0
			continue
		}
		if id := f.nc.ConnectedServerId(); id != server {
			server, misses = id, 0
		}
		err := f.probe()
		if unanswered(err) {
			f.unanswered.Add(1)
		} else {
			f.answered.Add(1)
		}
		if err == nil {
			misses, need = 0, failoverMisses
			continue
		}
		if !unanswered(err) {
			misses = 0 // an answer, if not the one hoped for (a permission, a lost bucket)
			continue
		}
		if misses++; misses < need {
			continue
		}
		url := f.nc.ConnectedUrlRedacted()
		if ferr := f.nc.ForceReconnect(); ferr != nil {
			continue // closed meanwhile
		}
		f.moves.Add(1)
		f.log.Warn().Err(err).Str("server", url).Int("unanswered", misses).Stringer("probe_interval", f.every).
			Msg("the registry does not answer through this NATS server (cut from its cluster?): moving to another server of the cluster")
		misses, need = 0, min(2*need, failoverMaxHold)
	}
}

// probe asks for the registry stream's information through the
// connection. Only the stream's leader answers it, or, once a server knows
// the stream has no leader, any of its replicas; the answer names the
// leader and when it last heard from each replica.
func (f *failover) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), f.every)
	defer cancel()
	s, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		return fmt.Errorf("pushlb: registry stream %s: %w", f.stream, err)
	}
	return quorate(s.CachedInfo().Cluster)
}

// quorate returns errNoQuorum when c, a stream's cluster information as
// its answering server sees it, shows no leader, or a leader that does
// not count a quorum of current replicas (itself included). A stream
// outside a cluster (c nil, one replica) always has its leader.
func quorate(c *jetstream.ClusterInfo) error {
	if c == nil || len(c.Replicas) == 0 {
		if c != nil && c.Leader == "" {
			return errNoQuorum
		}
		return nil
	}
	if c.Leader == "" {
		return errNoQuorum
	}
	current := 1 // the leader
	for _, p := range c.Replicas {
		if p != nil && p.Current && !p.Offline {
			current++
		}
	}
	if current < (len(c.Replicas)+1)/2+1 {
		return errNoQuorum
	}
	return nil
}

// unanswered reports whether err is a probe that the registry did not
// answer through this server: a timeout, no responders, the cluster
// unavailable, or an answer without a quorum behind it.
func unanswered(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, errNoQuorum) ||
		(errors.As(err, &api) && api.Code == http.StatusServiceUnavailable)
}
