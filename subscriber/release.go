package subscriber

import (
	"context"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// Releasing the ID of a crashed instance (docs/protocol.md, "Crash
// detection"). A probe that finds an instance dead after its connection's
// advisory proves its holder gone; the record would still block the ID
// until its lease ends, so that a restart of the instance (systemd's
// Restart=always, a container restart) could not claim it for half a TTL.
// The subscriber hands the proof to its Releaser, the client's reaper,
// which frees the ID when it leads (serverlist.Reaper.Release); only the
// leader writes, once per crash, whichever gateways probed.
//
// The leader may not follow the crashed instance's service (a gateway
// follows the services it routes): then no record it mirrors names the
// connection. An advisory names the client's connection name, and
// announce names its connection "announce <service> <instance-id>"
// (events.AnnouncerName): the leader reads that record from the registry, and
// probes and releases it as it would a followed one, without changing its
// own lists.

// Releaser frees the ID of an instance whose holder is provably gone;
// *serverlist.Reaper is the implementation.
type Releaser interface {
	// Leader reports whether this process's reaper leads: only the leader
	// releases, and only it reads records it does not follow.
	Leader() bool
	// Release ends the lease of service/id and removes its record if the
	// record still names conn and the lease was not renewed after
	// closedAt.
	Release(ctx context.Context, service, id string, conn serverlist.Connection, closedAt time.Time) (serverlist.Release, error)
}

// AllReleaseOutcomes returns the outcomes AdvisoryStats.Releases counts,
// for metrics.
func AllReleaseOutcomes() []serverlist.Release {
	return []serverlist.Release{serverlist.Released, serverlist.ReleaseRenamed, serverlist.ReleaseRenewed, serverlist.ReleaseFailed}
}

// UseReleaser gives the subscriber the client's reaper (nil: none), which
// it tells of the holders its probes found gone.
func (s *Subscriber) UseReleaser(r Releaser) {
	if r == nil {
		s.releaser.Store(nil)
		return
	}
	s.releaser.Store(&r)
}

// release hands the proof that in's holder is gone (a's connection
// closed at a's time, a probe found it dead) to the releaser. Runs on a
// probe's goroutine.
func (s *Subscriber) release(in serverlist.Instance, a disconnectAdvisory) {
	p := s.releaser.Load()
	if p == nil || !(*p).Leader() {
		return
	}
	out, err := (*p).Release(s.ctx, in.Service, in.InstanceID, a.connection(), a.Time)
	s.adv.releases[out].Add(1)
	if err != nil && s.ctx.Err() == nil {
		s.dropLog.Warn().Err(err).Str("service", in.Service).Str("id", in.InstanceID).
			Msg("advisory: could not release the ID of an instance found dead; a restart claims it once its lease ends")
	}
}

// probeUnfollowed is, at the reaper's leader, the probe of an announcer
// whose connection closed and whose service no record the mirror holds
// names: the record is read from the registry by the connection's name,
// and released when it names conn and a probe finds it dead.
func (s *Subscriber) probeUnfollowed(conn serverlist.Connection, a disconnectAdvisory) {
	p := s.releaser.Load()
	if p == nil || !(*p).Leader() {
		return
	}
	service, id, ok := events.ParseAnnouncerName(a.Client.Name)
	if !ok {
		return
	}
	s.goProbe(&s.adv.inFlight, maxAdvisoryProbes, advisoryProbeKey(service, id, conn), func() {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.ProbeTimeout+time.Second)
		held, err := s.reg.GetEntry(ctx, service, id)
		cancel()
		if err != nil || held.Connection() != conn {
			return
		}
		addr, _ := held.ProbeTarget()
		outcome, _ := s.probe(addr)
		s.adv.probes[outcome].Add(1)
		if outcome != ProbeAlive {
			s.release(held.Instance, a)
		}
	}, nil)
}
