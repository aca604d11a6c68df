package serverlist

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Scheduled leases: the expiry signal (wire protocol section 4, "The
// reaper by design").
//
// On a bucket that allows message schedules (nats-server 2.12+,
// AllowMsgSchedules), each lease write is also a JetStream message
// schedule: "Nats-Schedule: @every <lease>" with the target
// "<record key>.expired". Every renewal replaces the lease's message, and
// so its schedule, whose clock starts again; only a lease that was not
// renewed for a whole lease fires, and the server then writes one message
// on its expiry key. The reaper consumes the expiry keys alone
// ([ExpiryKeys]): it receives one message per lease that ended, none per
// renewal. The schedule's clock is the server's: no publisher clock is
// trusted.

const (
	// ExpiryKeys is the key filter of the expiry signals a scheduled
	// lease fires: "<record key>.expired".
	ExpiryKeys = "*.*" + expirySuffix
	// expirySuffix ends an expiry signal's key.
	expirySuffix = ".expired"

	// headerSchedule makes a message a schedule (nats-server 2.12+);
	// headerScheduleTarget names the subject it fires on.
	headerSchedule       = "Nats-Schedule"
	headerScheduleTarget = "Nats-Schedule-Target"
)

// scheduleEvery is the schedule period of a lease of ttl. The server starts
// an "@every" clock at the write's time rounded to the second, so a signal
// fires between period-0.5 s and period+0.5 s after the last renewal: the
// period is ttl plus at least half a second, in whole seconds, so that no
// lease ends before its TTL.
func scheduleEvery(ttl time.Duration) time.Duration {
	return max((ttl + 1499*time.Millisecond).Truncate(time.Second), time.Second)
}

// RecordOfExpiry returns the record key an expiry signal's key belongs to,
// or false if key is not one.
func RecordOfExpiry(key string) (string, bool) { return recordBefore(key, expirySuffix) }

// ScheduledLeases reports whether this registry writes scheduled leases:
// its bucket allowed message schedules when Open read it (or made it).
func (r *Registry) ScheduledLeases() bool { return r.scheduledLeases.Load() }

// noteSchedules records whether the bucket's stream allows message
// schedules, which decides the form of the leases this registry writes.
func (r *Registry) noteSchedules(cfg jetstream.StreamConfig) {
	r.scheduledLeases.Store(cfg.AllowMsgSchedules)
}

// errSchedulesUnsupported: the server kept the bucket's stream without
// message schedules after an update asked for them (older than 2.12).
var errSchedulesUnsupported = errors.New("the NATS server does not support message schedules (nats-server 2.12 or later)")

// errSchedulesLimited: the bucket's stream limits its bytes or messages, so
// it must keep the discard policy "new" (with "old", the server would make
// room by dropping the oldest messages: the records), which schedules
// cannot run with.
var errSchedulesLimited = errors.New("the registry bucket limits its bytes or messages (max_bytes, max_msgs), so it keeps the discard policy \"new\", which message schedules cannot run with")

// allowSchedules turns message schedules on for the bucket's stream when
// they are off, and returns whether it changed the stream; Open calls it on
// a bucket it just created, never on an existing one (the bucket belongs to
// the deployment, and nats-server does not let a stream turn schedules off
// again). The change adds a capability and alters no stored message. Schedules also need the discard policy "old",
// which a bucket without limits on its bytes and messages can take with no
// effect; a bucket with such limits is left alone (errSchedulesLimited). It needs the right to update the stream; a
// server before 2.12 keeps them off (errSchedulesUnsupported).
func (r *Registry) allowSchedules(ctx context.Context) (changed bool, err error) {
	st, err := r.js.Stream(ctx, "KV_"+r.cfg.Bucket)
	if err != nil {
		return false, fmt.Errorf("read the bucket's stream: %w", err)
	}
	cfg := st.CachedInfo().Config
	if cfg.AllowMsgSchedules {
		r.noteSchedules(cfg)
		return false, nil
	}
	if cfg.MaxBytes > 0 || cfg.MaxMsgs > 0 {
		return false, errSchedulesLimited
	}
	// Schedules need the discard policy "old" (nats-server refuses them
	// with "new", which KV buckets are made with): without a limit on the
	// stream's bytes or messages, the policy discards nothing either way.
	cfg.AllowMsgSchedules, cfg.Discard = true, jetstream.DiscardOld
	info, err := r.js.UpdateStream(ctx, cfg)
	if err != nil {
		return false, fmt.Errorf("allow message schedules on the bucket's stream: %w", err)
	}
	if !info.CachedInfo().Config.AllowMsgSchedules {
		return false, errSchedulesUnsupported
	}
	r.noteSchedules(info.CachedInfo().Config)
	return true, nil
}

// allowSchedulesOnCreate allows message schedules on a bucket Open just
// created, so that its leases are scheduled from the first; a failure is
// logged, and the leases are plain.
func (r *Registry) allowSchedulesOnCreate(ctx context.Context) {
	if _, err := r.allowSchedules(ctx); err != nil {
		r.log.Info().Err(err).Str("bucket", r.cfg.Bucket).
			Msg("serverlist: the new registry bucket does not allow message schedules: leases are written without their expiry signal, and the leading reaper receives every renewal")
	}
}

// readSchedules reads whether the bucket's stream allows message schedules
// now (an operator may have allowed them since Open), and records it.
func (r *Registry) readSchedules(ctx context.Context) (bool, error) {
	st, err := r.js.Stream(ctx, "KV_"+r.cfg.Bucket)
	if err != nil {
		return false, fmt.Errorf("read the bucket's stream: %w", err)
	}
	cfg := st.CachedInfo().Config
	r.noteSchedules(cfg)
	return cfg.AllowMsgSchedules, nil
}
