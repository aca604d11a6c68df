package main

import (
	"context"
	"errors"

	"github.com/pushlb/pushlb/publisher"
)

// watchHealth starts checking an announced instance every -health-interval
// with the readiness check (-health, else a TCP connect to -addr):
// -health-failures consecutive failures announce it offline (its record
// removed), the next passing check online again, with the same
// incarnation (publisher.WatchHealth). It returns the function that stops
// the checks and waits for them; with -health-interval 0 it starts nothing.
func (a *app) watchHealth(s *session) (stop func()) {
	if a.cfg.healthInterval == 0 {
		return func() {}
	}
	check, target := a.dialCheck, a.cfg.dialAddr
	if a.cfg.health != "" {
		check, target = a.healthCheck, a.cfg.health
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a.log.Info().Str("check", target).Stringer("interval", a.cfg.healthInterval).Int("failures", a.cfg.healthFailures).Msg("checking health")
	go func() {
		defer close(done)
		err := s.pub.WatchHealth(ctx, publisher.HealthConfig{
			Check:    check,
			Interval: a.cfg.healthInterval,
			Failures: a.cfg.healthFailures,
			OnCheck: func(err error, failures int) {
				if err != nil {
					a.log.Warn().Err(err).Int("failures", failures).Int("down_at", a.cfg.healthFailures).Msg("health check failed")
				}
			},
		})
		// The publisher logs the changes; Replaced is handled by the
		// caller, and the end of ctx is the caller's stop.
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, publisher.ErrReplaced) {
			a.log.Error().Err(err).Msg("health checks stopped")
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
