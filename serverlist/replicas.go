package serverlist

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultReplicas is the most replicas the registry bucket gets when
// [RegistryConfig.Replicas] is zero: three copies survive the loss of any
// one server, and more cost writes without a gain for a lease registry.
const DefaultReplicas = 3

// MaxReplicas is the most replicas JetStream allows a stream.
const MaxReplicas = 5

// ErrNotPermitted is returned (wrapped) by [Registry.ScaleUp] when the NATS
// server refused the stream update for want of permission: the user lacks
// publish rights on $JS.API.STREAM.UPDATE.<stream>, as a read-only gateway
// does (docs/security.md). The bucket belongs to the operator then.
var ErrNotPermitted = errors.New("serverlist: not permitted")

// Replica discovery.
//
// No JetStream API a normal user may call tells how many JetStream servers
// the cluster has ($JS.API.INFO gives the account's usage and limits, the
// server list is in $SYS, which only the system account sees). So the
// registry asks the server that places streams to decide:
//
//   - A server that reports no cluster name in its INFO (nc.ConnectedClusterName)
//     runs alone: one replica, nothing to try.
//   - Otherwise the bucket is created (or scaled up) with DefaultReplicas,
//     and on a placement refusal ("no suitable peers for placement",
//     "insufficient resources", "replicas > 1 not supported") with one
//     fewer, down to one. A cluster of two JetStream servers gets R2, of
//     three or more R3: min(3, JetStream servers).
//
// Placement counts the servers that are up: a bucket created while a node
// of a three-node cluster is down gets R2; a gateway that starts once the
// node is back scales it up to R3 ([Registry.ScaleUp]).

// replicaCandidates returns the replica counts to try, best first: the
// configured count alone, or the automatic sequence.
func (r *Registry) replicaCandidates() []int {
	if r.wantReplicas > 0 {
		return []int{r.wantReplicas}
	}
	if r.js.Conn().ConnectedClusterName() == "" {
		return []int{1}
	}
	out := make([]int, 0, DefaultReplicas)
	for n := DefaultReplicas; n >= 1; n-- {
		out = append(out, n)
	}
	return out
}

// placementRefused reports whether err is the server saying that it cannot
// place that many replicas, so that fewer may work.
func placementRefused(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jsErrCodeClusterNoPeers, jsErrCodeInsufficientResources, jsErrCodeReplicasNotSupported:
		return true
	}
	return false
}

// JetStream error codes the client library has no constant for.
const (
	jsErrCodeClusterNoPeers        jetstream.ErrorCode = 10005 // no suitable peers for placement
	jsErrCodeInsufficientResources jetstream.ErrorCode = 10023
	jsErrCodeReplicasNotSupported  jetstream.ErrorCode = 10074 // replicas > 1 in non-clustered mode
)

// infoAttempt bounds one stream-info request of Open. While a replicated
// bucket elects a new leader (its leader's server was lost) a request may
// go unanswered; the next one, a moment later, reaches the new leader.
const infoAttempt = time.Second

// retryUnanswered runs f with a context of at most infoAttempt, again while
// its request went unanswered (a timeout) and ctx has time left.
func retryUnanswered(ctx context.Context, f func(ctx context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, infoAttempt)
		err := f(actx)
		cancel()
		unanswered := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if err == nil || !unanswered || ctx.Err() != nil {
			return err
		}
	}
}

// ScaleUpInBackground runs ScaleUp on a goroutine of its own, bounded by
// timeout, and logs the outcome to the registry's logger: raised, not
// permitted (a warning: the operator raises the replicas), or failed. A
// gateway starts as fast as any other, whether its user may update the
// stream or not. stop cancels a scale-up still running and waits for it.
func (r *Registry) ScaleUpInBackground(timeout time.Duration) (stop func()) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		bucket := r.cfg.Bucket
		from, to, err := r.ScaleUp(ctx)
		switch {
		case errors.Is(err, ErrNotPermitted):
			r.log.Warn().Err(err).Str("bucket", bucket).Int("replicas", from).
				Msg("cannot scale the registry bucket up: this NATS user may not update the stream; going on with its replicas (the operator raises them: nats kv edit --replicas)")
		case err != nil && errors.Is(ctx.Err(), context.Canceled):
			// stopped meanwhile
		case err != nil:
			r.log.Warn().Err(err).Str("bucket", bucket).Msg("cannot scale the registry bucket up; going on with its replicas")
		case to > from:
			r.log.Info().Str("bucket", bucket).Int("from", from).Int("to", to).Msg("scaled the registry bucket up")
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// streamName is the JetStream stream behind a KV bucket.
func streamName(bucket string) string { return "KV_" + bucket }

// ScaleUp raises the bucket's replicas to the registry's configured count
// ([RegistryConfig.Replicas]), or with zero there to min(DefaultReplicas,
// what the cluster can place) (see the discovery above), when the bucket
// has fewer. It changes the stream's Replicas and nothing else, and never
// lowers them: a bucket with more replicas than configured is left as it
// is. from is the bucket's count before, to after (equal when nothing
// changed).
//
// It is the gateway's repair of a bucket created with too few replicas (by
// an older version, or while a node was down); [Open] never changes an
// existing bucket, and announcers never call ScaleUp. With permissions
// (docs/security.md) a gateway may not update streams: the server then
// drops the request, which waits until ctx ends, and the error wraps
// ErrNotPermitted. Bound ctx accordingly. A configured count the cluster
// cannot place is an error wrapping the server's.
func (r *Registry) ScaleUp(ctx context.Context) (from, to int, err error) {
	name := streamName(r.cfg.Bucket)
	s, err := r.js.Stream(ctx, name)
	if err != nil {
		return 0, 0, fmt.Errorf("serverlist: bucket %s: stream info: %w", r.cfg.Bucket, err)
	}
	cfg := s.CachedInfo().Config
	from = max(cfg.Replicas, 1)
	for _, n := range r.replicaCandidates() {
		if n <= from {
			return from, from, nil // never down
		}
		cfg.Replicas = n
		_, err := r.js.UpdateStream(ctx, cfg)
		if err == nil {
			return from, n, nil
		}
		if r.wantReplicas == 0 && placementRefused(err) {
			continue
		}
		return from, from, r.updateError(err, n)
	}
	return from, from, nil
}

// updateError explains a failed stream update: a request the server dropped
// for want of permission shows as a timeout, and the connection's last
// error names the subject.
func (r *Registry) updateError(err error, n int) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.Canceled) {
		if last := r.js.Conn().LastError(); errors.Is(last, nats.ErrPermissionViolation) &&
			strings.Contains(last.Error(), "STREAM.UPDATE."+streamName(r.cfg.Bucket)) {
			return fmt.Errorf("%w: update stream %s to R%d: %w", ErrNotPermitted, streamName(r.cfg.Bucket), n, last)
		}
	}
	return fmt.Errorf("serverlist: bucket %s: scale up to R%d: %w", r.cfg.Bucket, n, err)
}

// createReplicated creates the bucket with the first replica count the
// cluster places. Only placement refusals move on to fewer replicas.
func (r *Registry) createReplicated(ctx context.Context, kvcfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	candidates := r.replicaCandidates()
	// In the cluster of the server this connection is on: where a
	// supercluster's cluster cannot place the replicas asked for,
	// JetStream would otherwise place them in another cluster (another
	// region's: docs/multiregion.md). Without placement only when that
	// cluster cannot place even one (no JetStream server of its own).
	placements := []*jetstream.Placement{nil}
	if cluster := r.js.Conn().ConnectedClusterName(); cluster != "" {
		placements = []*jetstream.Placement{{Cluster: cluster}}
		if candidates[len(candidates)-1] == 1 {
			placements = append(placements, nil)
		}
	}
	var err error
	for _, placement := range placements {
		kvcfg.Placement = placement
		for _, n := range candidates {
			kvcfg.Replicas = n
			var kv jetstream.KeyValue
			if kv, err = r.js.CreateKeyValue(ctx, kvcfg); err == nil {
				r.logCreated(n, candidates[0])
				return kv, nil
			}
			if !placementRefused(err) {
				return nil, err
			}
		}
	}
	return nil, err
}

// logCreated logs the bucket's creation with n replicas, of wanted.
func (r *Registry) logCreated(n, wanted int) {
	if n < wanted {
		r.log.Warn().Str("bucket", r.cfg.Bucket).Int("replicas", n).Int("wanted", wanted).
			Msg("serverlist: created the registry bucket with fewer replicas: the cluster could not place more (fewer JetStream servers, or some down); a gateway that starts when they are up scales it up")
		return
	}
	r.log.Info().Str("bucket", r.cfg.Bucket).Int("replicas", n).Dur("ttl", r.cfg.TTL).Msg("serverlist: created the registry bucket")
}
