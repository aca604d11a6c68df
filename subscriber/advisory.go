package subscriber

import (
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/base/probe"
	"github.com/pushlb/pushlb/serverlist"
)

// Crash detection by client-disconnect advisories (docs/protocol.md,
// "Crash detection"). When a process dies, its kernel closes its TCP
// connection to NATS, and the server publishes a client-disconnect
// advisory in its system account; a deployment imports its account's
// advisories to Config.AdvisorySubject. A publisher's record names its
// connection (serverlist.Instance.NATSServerID, NATSClientID): an advisory
// concerns an instance only when it names exactly that connection.
//
// An advisory only starts a probe: a connection also ends when the network
// between the instance and its NATS server blips, or the server restarts,
// while the instance serves on; and any client allowed to publish on the
// subject could forge one. The probe connects to the instance: to its
// gossip node when the record names one (it lives in the process that held
// the connection), else to its service address. Refused or unreachable:
// the instance is taken offline at once (CauseAdvisory), for the record's
// revision, so that any later write of the record (the instance
// re-asserting itself after a reconnect) brings it back. Answered, and
// answered again over probe.ConfirmFor: the instance is kept; its publisher
// reconnects and rewrites its record with the new connection.

// Advisory defaults.
const (
	// DefaultProbeTimeout bounds one connect of a probe.
	DefaultProbeTimeout = probe.DefaultTimeout
	// AdvisoryCheckName names the short-lived connection Start opens and
	// closes to check that advisories arrive (tests that count a server's
	// connections leave it out).
	AdvisoryCheckName = "pushlb advisory check"
	// DefaultAdvisoryCheck is how long Start's check waits for the
	// advisory of a connection it opens and closes.
	DefaultAdvisoryCheck = 5 * time.Second
)

// maxAdvisoryProbes bounds the probes in flight: an advisory beyond it is
// counted (AdvisoryStats.Skipped) and left to gossip and leases.
const maxAdvisoryProbes = 1000

// maxAdvisorySize bounds an advisory's payload; the server's are about
// 1 KiB (a JWT makes them larger).
const maxAdvisorySize = 64 << 10

// disconnectAdvisoryType is the type of the server's client-disconnect
// advisory (nats-server's DisconnectEventMsgType).
const disconnectAdvisoryType = "io.nats.server.advisory.v1.client_disconnect"

// disconnectAdvisory is what the subscriber reads of the server's
// advisory (nats-server's DisconnectEventMsg).
type disconnectAdvisory struct {
	Type   string    `json:"type"`
	Time   time.Time `json:"timestamp"` // when the connection closed, by the server's clock
	Server struct {
		ID string `json:"id"`
	} `json:"server"`
	Client struct {
		ID   uint64 `json:"id"`
		Name string `json:"name"`
	} `json:"client"`
	Reason string `json:"reason"`
}

// connection is the connection a names.
func (a disconnectAdvisory) connection() serverlist.Connection {
	return serverlist.Connection{ServerID: a.Server.ID, ClientID: a.Client.ID}
}

// ProbeOutcome is a probe's verdict. Its String is the metric label.
type ProbeOutcome uint8

// The outcomes of a probe.
const (
	ProbeAlive       ProbeOutcome = iota // every connect answered: kept
	ProbeRefused                         // a connect was refused: removed
	ProbeUnreachable                     // a connect timed out or found no route: removed

	numProbeOutcomes
)

var probeOutcomeNames = [numProbeOutcomes]string{ProbeAlive: "alive", ProbeRefused: "refused", ProbeUnreachable: "unreachable"}

// String returns "alive", "refused", "unreachable", or "unknown".
func (o ProbeOutcome) String() string {
	if o >= numProbeOutcomes {
		return "unknown"
	}
	return probeOutcomeNames[o]
}

// AllProbeOutcomes returns every outcome, in order, for metrics.
func AllProbeOutcomes() []ProbeOutcome {
	return []ProbeOutcome{ProbeAlive, ProbeRefused, ProbeUnreachable}
}

// AdvisoryState says whether client-disconnect advisories reach the
// subscriber.
type AdvisoryState string

// The advisory states.
const (
	// AdvisoriesOff: no Config.AdvisorySubject.
	AdvisoriesOff AdvisoryState = "off"
	// AdvisoriesChecking: Start's check has not ended.
	AdvisoriesChecking AdvisoryState = "checking"
	// AdvisoriesOn: an advisory arrived (the check's, or any other).
	AdvisoriesOn AdvisoryState = "on"
	// AdvisoriesMissing: the check's advisory did not arrive: crash
	// detection falls back to gossip and leases. An advisory arriving
	// later turns the state to AdvisoriesOn.
	AdvisoriesMissing AdvisoryState = "missing"
)

// AdvisoryStats are the counters of crash detection by advisories.
type AdvisoryStats struct {
	// State says whether advisories arrive.
	State AdvisoryState `json:"state"`
	// Received counts the messages on the advisory subject, once handled;
	// Malformed those dropped (not a disconnect advisory, too large);
	// Matched the advisories that named the connection of a record (each
	// record counted); Skipped those whose probe was not started (one
	// already ran for the instance after an advisory of the same
	// connection, or maxAdvisoryProbes were running).
	Received  uint64 `json:"received"`
	Malformed uint64 `json:"malformed"`
	Matched   uint64 `json:"matched"`
	Skipped   uint64 `json:"skipped"`
	// Probes counts the probes that ended, by outcome (ProbeOutcome's
	// labels).
	Probes map[string]uint64 `json:"probes"`
	// Removals counts the instances taken offline after a probe found them
	// dead.
	Removals uint64 `json:"removals"`
	// Releases counts, while this process's reaper leads, the IDs of
	// instances found dead that it asked the reaper to release, by
	// outcome (serverlist.Release's labels, but not_leader).
	Releases map[string]uint64 `json:"releases"`
}

// advisories is the subscriber's part for advisories.
type advisories struct {
	state atomic.Value // AdvisoryState
	// check is the connection Start's check opened and closed: its
	// advisory proves they arrive. Zero when no check waits.
	checkMu sync.Mutex
	check   serverlist.Connection
	seen    chan struct{} // closed when check's advisory arrived
	logOnce sync.Once     // the state is logged once, then only a change to on

	received, malformed, matched, skipped, removals atomic.Uint64
	probes                                          [numProbeOutcomes]atomic.Uint64
	releases                                        [serverlist.ReleaseFailed + 1]atomic.Uint64
	inFlight                                        map[string]bool // advisoryProbeKey; guarded by Subscriber.dmu

	// unmatched holds, for unmatchedMemory, the advisories that named no
	// record the mirror held: an instance whose process died just after
	// announcing may be listed by its online event, and its record reach
	// the mirror, after its connection's advisory. At most maxUnmatched.
	unmatchedMu sync.Mutex
	unmatched   map[serverlist.Connection]unmatchedAdvisory
	pending     atomic.Bool // unmatched is not empty
}

// How long, and how many, advisories that named no record are kept for a
// record that comes after them.
const (
	unmatchedMemory = 5 * time.Second
	maxUnmatched    = 1024
)

// unmatchedAdvisory is an advisory kept for a record that comes later.
type unmatchedAdvisory struct {
	a  disconnectAdvisory
	at time.Time
}

// keepUnmatched keeps a, whose connection conn named no record, for
// unmatchedMemory; when maxUnmatched are kept, the oldest goes.
func (a *advisories) keepUnmatched(conn serverlist.Connection, adv disconnectAdvisory, now time.Time) {
	a.unmatchedMu.Lock()
	defer a.unmatchedMu.Unlock()
	if a.unmatched == nil {
		a.unmatched = make(map[serverlist.Connection]unmatchedAdvisory)
	}
	if len(a.unmatched) >= maxUnmatched {
		var oldest serverlist.Connection
		var at time.Time
		for c, u := range a.unmatched {
			if at.IsZero() || u.at.Before(at) {
				oldest, at = c, u.at
			}
		}
		delete(a.unmatched, oldest)
	}
	a.unmatched[conn] = unmatchedAdvisory{a: adv, at: now}
	a.pending.Store(true)
}

// takeMatched removes and returns the kept advisories whose connection
// match now finds records for, and forgets those kept too long.
func (a *advisories) takeMatched(now time.Time, match func(serverlist.Connection) bool) map[serverlist.Connection]disconnectAdvisory {
	if !a.pending.Load() {
		return nil
	}
	a.unmatchedMu.Lock()
	defer a.unmatchedMu.Unlock()
	var out map[serverlist.Connection]disconnectAdvisory
	for c, u := range a.unmatched {
		switch {
		case now.Sub(u.at) > unmatchedMemory:
			delete(a.unmatched, c)
		case match(c):
			if out == nil {
				out = make(map[serverlist.Connection]disconnectAdvisory)
			}
			out[c] = u.a
			delete(a.unmatched, c)
		}
	}
	a.pending.Store(len(a.unmatched) > 0)
	return out
}

func (a *advisories) stats() AdvisoryStats {
	st := AdvisoryStats{
		State: a.getState(), Received: a.received.Load(), Malformed: a.malformed.Load(),
		Matched: a.matched.Load(), Skipped: a.skipped.Load(), Removals: a.removals.Load(),
		Probes: make(map[string]uint64, numProbeOutcomes),
	}
	for o := range numProbeOutcomes {
		st.Probes[o.String()] = a.probes[o].Load()
	}
	st.Releases = make(map[string]uint64, len(a.releases))
	for _, o := range AllReleaseOutcomes() {
		st.Releases[o.String()] = a.releases[o].Load()
	}
	return st
}

func (a *advisories) getState() AdvisoryState {
	if s, ok := a.state.Load().(AdvisoryState); ok {
		return s
	}
	return AdvisoriesOff
}

// subscribeAdvisories subscribes to Config.AdvisorySubject.
func (s *Subscriber) subscribeAdvisories() (*nats.Subscription, error) {
	sub, err := s.nc.Subscribe(s.cfg.AdvisorySubject, s.onAdvisory)
	if err != nil {
		return nil, err
	}
	sub.SetPendingLimits(-1, -1)
	s.adv.state.Store(AdvisoriesChecking)
	return sub, nil
}

// onAdvisory runs on the NATS delivery goroutine: it decodes, finds the
// records that name the connection and starts their probes.
func (s *Subscriber) onAdvisory(msg *nats.Msg) {
	defer s.adv.received.Add(1)
	var a disconnectAdvisory
	if len(msg.Data) > maxAdvisorySize || json.Unmarshal(msg.Data, &a) != nil || a.Type != disconnectAdvisoryType || a.Server.ID == "" || a.Client.ID == 0 {
		s.adv.malformed.Add(1)
		s.dropLog.Warn().Str("subject", msg.Subject).Int("bytes", len(msg.Data)).Msg("dropped a message on the advisory subject that is not a client-disconnect advisory")
		return
	}
	conn := a.connection()
	s.advisoryArrived(conn)
	if !s.probeConnection(conn, a) {
		s.adv.keepUnmatched(conn, a, time.Now())
		s.probeUnfollowed(conn, a)
	}
}

// probeConnection starts the probes of the followed records that name
// conn, and reports whether the mirror holds a record that names it.
func (s *Subscriber) probeConnection(conn serverlist.Connection, a disconnectAdvisory) bool {
	entries := s.mirror.ByConnection(conn)
	for _, e := range entries {
		if !s.scope.has(e.Service) {
			continue
		}
		s.adv.matched.Add(1)
		s.startProbe(e, a)
	}
	return len(entries) > 0
}

// recheckUnmatched probes the records that came to the mirror after their
// connection's advisory (advisories.unmatched). The worker calls it after
// the registry's changes.
func (s *Subscriber) recheckUnmatched() {
	matched := s.adv.takeMatched(time.Now(), func(c serverlist.Connection) bool { return len(s.mirror.ByConnection(c)) > 0 })
	for conn, a := range matched {
		s.probeConnection(conn, a)
	}
}

// advisoryArrived records that advisories arrive, and ends Start's check
// when conn is its connection.
func (s *Subscriber) advisoryArrived(conn serverlist.Connection) {
	if s.adv.getState() != AdvisoriesOn {
		prev := s.adv.getState()
		s.adv.state.Store(AdvisoriesOn)
		if prev == AdvisoriesMissing {
			s.log.Info().Str("subject", s.cfg.AdvisorySubject).Msg("client-disconnect advisories arrive after all: crash detection in milliseconds is on")
		}
	}
	s.adv.checkMu.Lock()
	if !s.adv.check.IsZero() && conn == s.adv.check {
		close(s.adv.seen)
		s.adv.check = serverlist.Connection{}
	}
	s.adv.checkMu.Unlock()
}

// checkAdvisories opens a connection like the subscriber's own and closes
// it, and waits for its advisory: the one way to know that the server
// publishes advisories and the deployment imports them where the
// subscriber listens. It logs the answer once.
func (s *Subscriber) checkAdvisories() {
	defer s.wg.Done()
	opts := s.nc.Opts
	opts.Name = AdvisoryCheckName
	opts.AllowReconnect, opts.RetryOnFailedConnect = false, false
	opts.ClosedCB, opts.DisconnectedCB, opts.DisconnectedErrCB, opts.ConnectedCB = nil, nil, nil, nil
	opts.ReconnectedCB, opts.DiscoveredServersCB, opts.AsyncErrorCB, opts.ReconnectErrCB = nil, nil, nil, nil
	opts.LameDuckModeHandler, opts.ReconnectToServerCB = nil, nil
	nc, err := opts.Connect()
	if err != nil {
		s.log.Warn().Err(err).Str("subject", s.cfg.AdvisorySubject).Msg("cannot check whether client-disconnect advisories arrive; until one does, crash detection relies on gossip and leases")
		return
	}
	id, err := nc.GetClientID()
	if err != nil {
		nc.Close()
		s.log.Warn().Err(err).Msg("cannot check whether client-disconnect advisories arrive (the server reports no client ID); crash detection relies on gossip and leases")
		return
	}
	seen := make(chan struct{})
	s.adv.checkMu.Lock()
	s.adv.check, s.adv.seen = serverlist.Connection{ServerID: nc.ConnectedServerId(), ClientID: id}, seen
	s.adv.checkMu.Unlock()
	nc.Close()
	t := time.NewTimer(s.cfg.AdvisoryCheck)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return
	case <-seen:
		s.log.Info().Str("subject", s.cfg.AdvisorySubject).Msg("client-disconnect advisories arrive: a crashed instance is probed and removed within milliseconds")
	case <-t.C:
		s.adv.checkMu.Lock()
		s.adv.check = serverlist.Connection{}
		s.adv.checkMu.Unlock()
		if s.adv.getState() == AdvisoriesOn {
			return // another advisory arrived: the check's may come late
		}
		s.adv.state.CompareAndSwap(AdvisoriesChecking, AdvisoriesMissing)
		s.log.Warn().Str("subject", s.cfg.AdvisorySubject).Dur("waited", s.cfg.AdvisoryCheck).
			Msg("no client-disconnect advisory arrived: the NATS server has no system account, or does not import this account's $SYS.ACCOUNT.<account>.DISCONNECT to this subject, or this user may not subscribe to it (docs/security.md); crash detection falls back to gossip and leases")
	}
}

// advisoryProbeKey names, in advisories.inFlight, the probe of the instance
// service/id after the advisory of its connection conn. The connection is
// part of it: a probe is about the record that named conn, and its verdict
// holds for that record's revision only (advisoryGone). An instance that
// re-announces on a new connection (a restart under the same ID, a
// withdrawal and a new announce) while the probe of its previous
// connection runs, and whose new connection then ends too, needs a probe
// of its own: the running one, dead or not, removes nothing of the new
// record, and skipping the new one would leave the crash to the lease.
func advisoryProbeKey(service, id string, conn serverlist.Connection) string {
	return instanceProbeKey(service, id) + "\x00" + conn.ServerID + "\x00" + strconv.FormatUint(conn.ClientID, 10)
}

// startProbe probes the instance of e in a goroutine, unless a probe of it
// after the advisory of the same connection runs already, the bound is
// reached or the subscriber is closed.
func (s *Subscriber) startProbe(e serverlist.Entry, a disconnectAdvisory) {
	if !s.goProbe(&s.adv.inFlight, maxAdvisoryProbes, advisoryProbeKey(e.Service, e.InstanceID, a.connection()), func() { s.probeAfterAdvisory(e, a) }, nil) {
		s.adv.skipped.Add(1)
		s.dropLog.Debug().Str("service", e.Service).Str("id", e.InstanceID).Uint64("revision", e.Revision).
			Str("nats_server", a.Server.ID).Uint64("nats_client", a.Client.ID).
			Msg("advisory: not probed: a probe after an advisory of this connection runs, or too many probes do")
	}
}

func (s *Subscriber) probeAfterAdvisory(e serverlist.Entry, a disconnectAdvisory) {
	addr, kind := e.ProbeTarget()
	began := time.Now()
	outcome, err := s.probe(addr)
	s.adv.probes[outcome].Add(1)
	log := func(ev *zerolog.Event) *zerolog.Event {
		return ev.Str("service", e.Service).Str("id", e.InstanceID).Int64("incarnation", e.Incarnation).
			Str("reason", a.Reason).Str("probe", kind).Str("addr", addr).Stringer("outcome", outcome).
			Dur("probe_took", time.Since(began))
	}
	if outcome == ProbeAlive {
		log(s.dropLog.Info()).Msg("advisory: the instance's NATS connection closed, but the instance answers: kept (it re-announces on its new connection)")
		return
	}
	if s.advisoryGone(e) {
		log(s.log.Info()).AnErr("probe_error", err).Msg("advisory: the instance's NATS connection closed and a probe found it dead: removed")
	} else {
		log(s.dropLog.Debug()).Uint64("revision", e.Revision).AnErr("probe_error", err).
			Msg("advisory: a probe found the instance dead, but its record changed since the advisory (or it was out already): nothing removed")
	}
	s.release(e.Instance, a)
}

// probe connects to addr, then again while it answers (probe.Answers).
// The first failed connect decides; the subscriber's end gives no verdict.
func (s *Subscriber) probe(addr string) (ProbeOutcome, error) {
	err := probe.Answers(s.ctx, addr, s.cfg.ProbeTimeout)
	switch {
	case err == nil:
		return ProbeAlive, nil
	case s.ctx.Err() != nil:
		return ProbeAlive, err // closing: no verdict, nothing removed
	case errors.Is(err, syscall.ECONNREFUSED):
		return ProbeRefused, err
	}
	return ProbeUnreachable, err
}

// advisoryGone takes the instance of e offline for e's incarnation and
// record revision: a later write of its record brings it back. It reports
// whether the live set changed, and counts the removal before the
// delivery it causes (a reader that saw the delivery sees the count).
func (s *Subscriber) advisoryGone(e serverlist.Entry) bool {
	s.mu.Lock()
	out := s.table.crashed(e.Service, e.InstanceID, e.Incarnation, e.Revision, time.Now())
	if out == applied {
		s.noteLocked(e.Service, e.InstanceID, events.CauseAdvisory, time.Time{})
	}
	s.mu.Unlock()
	if out != applied {
		return false
	}
	s.adv.removals.Add(1)
	s.markDirty(e.Service)
	return true
}
