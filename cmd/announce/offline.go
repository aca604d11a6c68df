package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// offline runs offline mode: read the instance's registry entry for its
// incarnation, publish the offline event, then purge the entry.
//
// It opens the bucket without creating or updating it, unlike the other
// modes (serverlist.Open): a one-shot tool must not change the lease a
// deployment configured.
func (a *app) offline() int {
	var code int
	sig, _ := a.interruptible(func(ctx context.Context) error {
		code = a.runOffline(ctx)
		return nil
	})
	if sig != nil {
		return exitFailure
	}
	return code
}

func (a *app) runOffline(ctx context.Context) int {
	service, id := a.cfg.instance.Service, a.cfg.instance.InstanceID
	log := a.log
	nc, err := a.dial(ctx)
	if err != nil {
		log.Error().Err(err).Msg("cannot connect")
		return exitFailure
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()

	key, err := serverlist.EncodeKey(service, id)
	if err != nil { // checked by the flags already
		log.Error().Err(err).Msg("invalid instance")
		return exitUsage
	}
	kv, registered, err := a.lookupEntry(ctx, nc, key)
	if err != nil {
		log.Error().Err(err).Msg("cannot read the registry")
		return exitFailure
	}

	incarnation, source := a.cfg.incarnation, "-incarnation"
	switch {
	case incarnation > 0:
	case registered != nil:
		incarnation, source = registered.Incarnation, "registry"
	default:
		incarnation, source = time.Now().UnixNano(), "current time (not registered)"
	}

	subject, data, err := events.EncodeMessage(a.cfg.prefix, events.Event{
		Kind: events.Offline, Service: service, InstanceID: id,
		Incarnation: incarnation, At: time.Now(), Reason: a.cfg.reason,
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot encode the offline event")
		return exitFailure
	}
	if err := nc.Publish(subject, data); err != nil {
		log.Error().Err(err).Str("subject", subject).Msg("cannot publish the offline event")
		return exitFailure
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		log.Error().Err(err).Str("subject", subject).Msg("cannot publish the offline event")
		return exitFailure
	}
	log.Info().Int64("incarnation", incarnation).Str("incarnation_from", source).Str("subject", subject).Msg("announced offline")

	if registered == nil {
		log.Info().Msg("no registry entry to remove")
		return exitOK
	}
	if err := kv.Purge(ctx, key); err != nil {
		log.Error().Err(err).Msg("cannot remove the registry entry; it expires with its lease")
		return exitFailure
	}
	log.Info().Msg("deregistered")
	return exitOK
}

// lookupEntry opens the registry bucket without changing it and reads the
// entry under key. A missing bucket or key gives a nil entry. An entry that
// does not decode is logged and given the current time as incarnation, so
// that it is still purged.
func (a *app) lookupEntry(ctx context.Context, nc *nats.Conn, key string) (jetstream.KeyValue, *serverlist.Instance, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	bucket := serverlist.BucketName(a.cfg.prefix)
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		a.log.Debug().Str("bucket", bucket).Msg("registry bucket does not exist")
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return kv, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("get %s from %s: %w", key, bucket, err)
	}
	var in serverlist.Instance
	if err := json.Unmarshal(e.Value(), &in); err != nil || in.Incarnation <= 0 {
		a.log.Warn().Err(err).Str("key", key).Msg("registry entry is malformed; using the current time as incarnation")
		return kv, &serverlist.Instance{Incarnation: time.Now().UnixNano()}, nil
	}
	return kv, &in, nil
}
