package serverlist

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketMaxConsumers is the consumer limit [Open] gives the registry's
// stream when it creates the bucket. A client that follows some services
// (MirrorConfig.Scoped) watches each with a consumer of its own, so the
// stream holds one per gateway and followed service (plus the leading
// reaper's): 100 gateways following 10 services each already reach
// nats-server's default of 1,000 consumers per stream
// (jetstream { limits { default_max_consumers } }), past which a follow
// fails with "maximum consumers limit reached". The figure is a cap, not a
// reservation: it costs nothing until the consumers exist.
const BucketMaxConsumers = 1_000_000

// raiseConsumerLimitOnCreate sets the stream of a bucket Open just created
// to allow BucketMaxConsumers consumers; a failure (a server that refuses
// the update, a user not permitted to make it) is logged, and the server's
// limit stands.
func (r *Registry) raiseConsumerLimitOnCreate(ctx context.Context) {
	if err := r.raiseConsumerLimit(ctx); err != nil {
		r.log.Warn().Err(err).Str("bucket", r.cfg.Bucket).Int("wanted", BucketMaxConsumers).
			Msg("serverlist: the new registry bucket keeps the server's consumer limit (1,000 per stream by default): scoped gateways need one consumer per followed service (docs/config.md, \"What a gateway follows\")")
	}
}

// raiseConsumerLimit sets the bucket's stream's MaxConsumers to
// BucketMaxConsumers unless it is that already.
func (r *Registry) raiseConsumerLimit(ctx context.Context) error {
	st, err := r.js.Stream(ctx, streamName(r.cfg.Bucket))
	if err != nil {
		return fmt.Errorf("read the bucket's stream: %w", err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxConsumers == BucketMaxConsumers {
		return nil
	}
	cfg.MaxConsumers = BucketMaxConsumers
	if _, err := r.js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("set the bucket's stream's consumer limit to %d: %w", BucketMaxConsumers, err)
	}
	return nil
}

// consumerLimitHint explains err when it is the server's refusal of one
// more consumer on the registry's stream, "" otherwise.
func consumerLimitHint(err error) string {
	// A KV watch creates its consumer through nats.go's older JetStream
	// API, whose errors are of its own type.
	var legacy *nats.APIError
	if !errors.Is(err, jetstream.ErrMaximumConsumersLimit) &&
		(!errors.As(err, &legacy) || legacy.ErrorCode != nats.ErrorCode(jetstream.JSErrCodeMaximumConsumersLimit)) {
		return ""
	}
	return "the registry's stream allows no more consumers: a scoped client holds one per followed service; raise the limit (nats stream edit KV_<bucket> --max-consumers N, or nats-server's jetstream { limits { default_max_consumers: N } }; a bucket pushlb creates allows 1,000,000)"
}
