package main

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/events"
)

// syncer keeps every backend it was given equal to its service's list, and
// watches HAProxy's process: after a restart or a reload (a new process ID
// behind the socket, or the socket back after a refusal) every backend is
// read again and reconciled.
//
// Threading: observe is the client's ListObserver (any goroutine, quick);
// run owns the process watch and one goroutine per backend.
type syncer struct {
	api       *runtimeAPI
	opts      *options
	log       zerolog.Logger
	m         *metrics
	backends  []*backendSync
	byService map[string][]*backendSync
}

func newSyncer(api *runtimeAPI, opts *options, log zerolog.Logger, m *metrics) *syncer {
	s := &syncer{api: api, opts: opts, log: log, m: m, byService: map[string][]*backendSync{}}
	for _, f := range opts.follow {
		b := newBackendSync(f.Service, f.Backend, api, opts, log, m)
		s.backends = append(s.backends, b)
		s.byService[f.Service] = append(s.byService[f.Service], b)
	}
	return s
}

// crashCauses are the departures that are not drained: the instance is
// gone, its connections are dead.
var crashCauses = map[events.Cause]bool{
	events.CauseAdvisory: true,
	events.CauseGossip:   true,
	events.CauseRegistry: true,
}

// observe is told every list change before the watches get the new list:
// it marks the instances that left by a crash.
func (s *syncer) observe(lc pushlb.ListChange) {
	for _, b := range s.byService[lc.Service] {
		for _, j := range lc.Joined {
			b.joined(j.Server.ID)
		}
		for _, l := range lc.Left {
			if crashCauses[l.Cause] {
				b.crashed(l.Server.ID)
			}
		}
	}
}

// run follows each backend's service on c and syncs until ctx ends, then
// waits for the backends' goroutines.
func (s *syncer) run(ctx context.Context, c *pushlb.Client) {
	var wg sync.WaitGroup
	for _, b := range s.backends {
		wg.Go(func() { b.run(ctx) })
		stop := c.Watch(b.service, b.setList)
		defer stop()
	}
	s.watchProcess(ctx)
	wg.Wait()
}

// watchProcess reads HAProxy's process ID every -poll and makes every
// backend reconcile when it changed or when the socket answers again after
// a failure; every -resync it makes them reconcile regardless (a change
// made by someone else). It returns when ctx ends.
func (s *syncer) watchProcess(ctx context.Context) {
	poll := time.NewTicker(s.opts.poll)
	defer poll.Stop()
	var resync <-chan time.Time
	if s.opts.resync > 0 {
		t := time.NewTicker(s.opts.resync)
		defer t.Stop()
		resync = t.C
	}
	var last processInfo
	up, down := false, false // down: a failure was logged since the last answer
	for {
		info, err := s.api.processInfo(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !down {
				s.log.Warn().Err(err).Str("socket", s.api.String()).Msg("HAProxy's runtime API does not answer")
				s.m.errors.WithLabelValues("", errorKind(err)).Inc()
				down = true
			}
			up = false
		case last.PID == 0:
			s.log.Info().Int("pid", info.PID).Str("version", info.Version).Msg("HAProxy answers")
			up, last = true, info
		case info.PID != last.PID || info.Uptime < last.Uptime || !up:
			s.log.Info().Int("pid", info.PID).Int("was", last.PID).Msg("HAProxy restarted or reloaded; reconciling every backend")
			s.m.restarts.Inc()
			up, last = true, info
			s.reconcile()
		default:
			last = info
		}
		if err == nil {
			down = false
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		case <-resync:
			s.reconcile()
		}
	}
}

func (s *syncer) reconcile() {
	for _, b := range s.backends {
		b.reconcile()
	}
}
