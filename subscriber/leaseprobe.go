package subscriber

import (
	"context"
	"time"
)

// Lease probes. A publisher that claims its ID keeps its lease apart from
// its record (serverlist.Registry.Claim): its renewals write the lease key,
// which the mirror does not watch, so no renewal reaches the membership to
// undo an offline event as a record write does (see membership.registered).
// After an offline event takes out an instance whose record stays (still
// there a second later), the subscriber reads the instance's lease, and
// again after each renewal interval (a third of the TTL) for up to one TTL: a renewal in
// between proves the holder alive after the offline, which was forged, and
// brings the instance back as a record write would. The record's removal
// (a real withdrawal) or the lease's end (a crash) ends the probe.

// maxLeaseProbes bounds the probes in flight: a flood of forged offlines
// costs at most this many goroutines and reads per renewal interval.
const maxLeaseProbes = 10_000

// leaseProbeRounds is how many renewal intervals a probe waits for a
// renewal: one TTL.
const leaseProbeRounds = 3

// leaseProbeSettle is how long a probe waits before its first read (at most
// a sixth of the TTL): a real withdrawal's record is gone by then. A renewal
// within it is taken for one before the offline, so the revival may come
// one renewal later.
const leaseProbeSettle = time.Second

// probeLease starts a lease probe for service/id unless one runs already,
// the bound is reached or the subscriber is closed.
func (s *Subscriber) probeLease(service, id string) {
	s.goProbe(&s.probes, maxLeaseProbes, instanceProbeKey(service, id),
		func() { s.leaseProbe(service, id) },
		func() { s.stats.leaseProbes.Add(1) })
}

// instanceProbeKey names the instance service/id in a set of probes in
// flight (goProbe).
func instanceProbeKey(service, id string) string { return service + "\x00" + id }

// goProbe runs probe in a goroutine that Close waits for, with key (what
// the probe is about: instanceProbeKey, advisoryProbeKey) marked in
// inFlight (a set guarded by dmu) while it runs, then calls ended unless
// it is nil. It reports false, and runs nothing, when a probe of key is in
// flight already, limit probes are, or the subscriber is closed.
func (s *Subscriber) goProbe(inFlight *map[string]bool, limit int, key string, probe, ended func()) bool {
	s.dmu.Lock()
	if s.stopped || (*inFlight)[key] || len(*inFlight) >= limit {
		s.dmu.Unlock()
		return false
	}
	if *inFlight == nil {
		*inFlight = make(map[string]bool)
	}
	(*inFlight)[key] = true
	s.wg.Add(1)
	s.dmu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			s.dmu.Lock()
			delete(*inFlight, key)
			s.dmu.Unlock()
			if ended != nil {
				ended()
			}
		}()
		probe()
	}()
	return true
}

func (s *Subscriber) leaseProbe(service, id string) {
	ttl := s.reg.Config().TTL
	read := func() (uint64, bool) {
		s.stats.leaseProbeReads.Add(1)
		ctx, cancel := context.WithTimeout(s.ctx, ttl/3)
		defer cancel()
		rev, err := s.reg.LeaseRevision(ctx, service, id)
		return rev, err == nil
	}
	// A withdrawal removes the record right after its offline event: give
	// it a moment, so that a churn wave costs the registry no reads.
	t := time.NewTimer(min(leaseProbeSettle, ttl/6))
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return
	case <-t.C:
	}
	if _, ok := s.mirror.Entry(service, id); !ok {
		return
	}
	// No lease: a record that carries its own (its refreshes reach the
	// mirror), or a holder already gone.
	before, ok := read()
	if !ok {
		return
	}
	t.Reset(ttl / 3)
	for range leaseProbeRounds {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		rec, ok := s.mirror.Entry(service, id)
		if !ok {
			return // removed: the offline was real
		}
		now, ok := read()
		if !ok {
			return // ended: the holder is gone, a reaper removes the record
		}
		if now > before {
			s.registryRefreshed(service, id, rec.Incarnation, now)
			return
		}
		t.Reset(ttl / 3)
	}
}
