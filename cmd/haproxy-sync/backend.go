package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
)

// instance is what the sync needs of one server of pushlb's list, copied
// out of the balancer's list on the goroutine that applied it.
type instance struct {
	ID, Host, Zone string
	Port, Weight   int
	Secure         bool // TLS (https)
}

// target is one server a backend must have, as HAProxy writes it.
type target struct {
	id     string
	name   string
	addr   string // an IP address
	port   int
	weight int // HAProxy's scale, 1 to 256
	backup bool
	ssl    bool // a secure instance: "ssl" and -tls-options
}

// Timing of a backend's loop.
const (
	// drainPoll is how often a draining server's sessions are read.
	drainPoll = 5 * time.Millisecond
	// busyPoll is how often the deletion of a server that still has
	// connections is tried again, once its drain is over.
	busyPoll = 100 * time.Millisecond
	// minRetry and maxRetry bound the backoff after a failed step.
	minRetry = 50 * time.Millisecond
	maxRetry = 5 * time.Second
	// resolveTimeout bounds the resolution of one host name.
	resolveTimeout = 2 * time.Second
)

// backendSync keeps one HAProxy backend equal to one service's list.
//
// Threading: setList, crashed, joined and reconcile are called from any
// goroutine (pushlb's, the process watcher's); they only record under mu
// and wake the loop. Everything that talks to HAProxy runs on run's
// goroutine, one step at a time, which alone owns the fields below mu's.
type backendSync struct {
	service, backend string
	api              *runtimeAPI
	opts             *options
	log              zerolog.Logger
	m                *metrics
	wake             chan struct{}

	mu     sync.Mutex
	list   []instance
	listed bool // a list was received (Watch gives one at once)
	reread bool // HAProxy's state must be read before the next change
	// crash holds the server names whose instance left by a crash (an
	// advisory, gossip, a lease's end): they are not drained.
	crash map[string]bool

	// Owned by run's goroutine.
	have     map[string]*haServer // the backend as last read and changed
	leaving  map[string]leaving   // our servers on their way out
	resolved map[string]string    // host name → IP, until the next read
	refused  map[string]string    // instance ID → the error logged for it
	failures int
	lastErr  string
}

// leaving is a server on its way out of a backend.
type leaving struct {
	deadline time.Time // drained until then at most
	shut     bool      // its sessions were shut down
}

func newBackendSync(service, backend string, api *runtimeAPI, opts *options, log zerolog.Logger, m *metrics) *backendSync {
	return &backendSync{
		service: service, backend: backend, api: api, opts: opts, m: m,
		log:      log.With().Str("service", service).Str("backend", backend).Logger(),
		wake:     make(chan struct{}, 1),
		reread:   true,
		crash:    map[string]bool{},
		leaving:  map[string]leaving{},
		refused:  map[string]string{},
		resolved: map[string]string{},
	}
}

// setList records pushlb's list of the service (a Watch callback: quick,
// never blocks), and wakes the loop when it differs from the last one.
func (b *backendSync) setList(servers []*balancer.Server) {
	list := make([]instance, 0, len(servers))
	for _, s := range servers {
		list = append(list, instance{ID: s.ID, Host: s.Host, Zone: s.Zone, Port: s.Port, Weight: s.Weight, Secure: s.URLScheme() == "https"})
	}
	b.mu.Lock()
	same := b.listed && slices.Equal(b.list, list)
	b.list, b.listed = list, true
	b.mu.Unlock()
	if !same {
		b.poke()
	}
}

// crashed records that an instance left by a crash, before the list
// without it arrives (the list observer runs before the watches).
func (b *backendSync) crashed(id string) {
	b.mu.Lock()
	b.crash[b.opts.serverName(id)] = true
	b.mu.Unlock()
}

// joined forgets a crash of an instance that is back.
func (b *backendSync) joined(id string) {
	b.mu.Lock()
	delete(b.crash, b.opts.serverName(id))
	b.mu.Unlock()
}

// reconcile makes the next step read the backend from HAProxy first.
func (b *backendSync) reconcile() {
	b.mu.Lock()
	b.reread = true
	b.mu.Unlock()
	b.poke()
}

func (b *backendSync) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// run applies lists until ctx ends. A failed step is logged (once per
// distinct error, then every 20th failure), counted, and retried with
// backoff after reading the backend again.
func (b *backendSync) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next, err := b.step(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			b.failures++
			b.m.errors.WithLabelValues(b.backend, errorKind(err)).Inc()
			b.mu.Lock()
			b.reread = true
			b.mu.Unlock()
			if msg := err.Error(); msg != b.lastErr || b.failures%20 == 0 {
				b.lastErr = msg
				b.log.Error().Err(err).Str("kind", errorKind(err)).Int("failures", b.failures).Msg("sync failed; retrying")
			}
			next = min(minRetry<<min(b.failures-1, 10), maxRetry)
		} else if b.failures > 0 {
			b.log.Info().Int("failures", b.failures).Msg("sync recovered")
			b.failures, b.lastErr = 0, ""
		}
		if next <= 0 {
			next = time.Hour
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-b.wake:
		case <-timer.C:
		}
	}
}

// step brings the backend one step closer to the list and returns when it
// wants to run again (0: at the next change).
func (b *backendSync) step(ctx context.Context) (time.Duration, error) {
	b.mu.Lock()
	list, listed, reread := b.list, b.listed, b.reread
	crash := make(map[string]bool, len(b.crash))
	for k := range b.crash {
		crash[k] = true
	}
	b.reread = false
	b.mu.Unlock()
	if !listed {
		return 0, nil
	}
	if reread || b.have == nil {
		if err := b.read(ctx); err != nil {
			return 0, err
		}
	} else if len(b.leaving) > 0 {
		if err := b.api.readStats(ctx, b.backend, b.have); err != nil {
			return 0, err
		}
	}
	want := b.targets(ctx, list)

	var errs []error
	for name, t := range want {
		h := b.have[name]
		switch {
		case h == nil:
			errs = append(errs, b.add(ctx, t))
		case t.sameKind(h):
			delete(b.leaving, name)
			errs = append(errs, b.update(ctx, h, t))
		}
		// A server whose zone changed sides (backup or not), or that
		// turned secure or plain, leaves below and comes back at the next
		// step: HAProxy cannot change either at runtime.
	}
	now := time.Now()
	for name, h := range b.have {
		if t, ok := want[name]; !b.opts.ours(name) || ok && t.sameKind(h) {
			continue
		}
		errs = append(errs, b.remove(ctx, h, crash[name], now))
	}
	b.m.servers.WithLabelValues(b.backend).Set(float64(b.countOurs()))
	next := time.Duration(0)
	for name := range want {
		if b.have[name] == nil { // deleted just now to come back (its zone's side changed)
			next = drainPoll
		}
	}
	for _, l := range b.leaving {
		if l.deadline.After(now) {
			next = drainPoll
			break
		}
		next = busyPoll
	}
	return next, errors.Join(errs...)
}

// read reads the whole backend from HAProxy and checks that it can take
// servers at runtime.
func (b *backendSync) read(ctx context.Context) error {
	rows, err := b.api.stats(ctx, b.backend, 2)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return fmt.Errorf("%w: %q", ErrUnknownBackend, b.backend)
	}
	if algo := rows[0]["algo"]; algo == "static-rr" {
		return fmt.Errorf("%w: backend %q balances with %s (use roundrobin, leastconn, random or first)", ErrStaticAlgorithm, b.backend, algo)
	}
	have, err := b.api.backendServers(ctx, b.backend)
	if err != nil {
		return err
	}
	b.m.reads.WithLabelValues(b.backend).Inc()
	if b.have == nil {
		b.log.Info().Int("servers", len(have)).Int("ours", countOurs(have, b.opts)).Msg("backend read")
	} else {
		b.log.Debug().Int("servers", len(have)).Msg("backend read again")
	}
	b.have = have
	b.resolved = map[string]string{}
	for name := range b.leaving {
		if have[name] == nil {
			delete(b.leaving, name)
		}
	}
	return nil
}

func (b *backendSync) countOurs() int { return countOurs(b.have, b.opts) }

func countOurs(have map[string]*haServer, o *options) int {
	n := 0
	for name := range have {
		if o.ours(name) {
			n++
		}
	}
	return n
}

// targets turns pushlb's list into the servers the backend must have. An
// instance whose host cannot be resolved is left out, logged once and
// counted.
func (b *backendSync) targets(ctx context.Context, list []instance) map[string]target {
	want := make(map[string]target, len(list))
	for _, in := range list {
		addr, err := b.resolve(ctx, in.Host)
		if err != nil {
			if b.refused[in.ID] != err.Error() {
				b.refused[in.ID] = err.Error()
				b.m.errors.WithLabelValues(b.backend, errorKind(err)).Inc()
				b.log.Error().Err(err).Str("id", in.ID).Msg("instance left out of the backend")
			}
			continue
		}
		delete(b.refused, in.ID)
		t := target{
			id: in.ID, name: b.opts.serverName(in.ID), addr: addr, port: in.Port,
			weight: haproxyWeight(in.Weight), backup: b.opts.backup(in.Zone), ssl: in.Secure,
		}
		want[t.name] = t
	}
	return want
}

// sameKind reports whether h is what t must be in what HAProxy cannot
// change at runtime: backup or not, TLS or not.
func (t target) sameKind(h *haServer) bool { return h.Backup == t.backup && h.SSL == t.ssl }

// resolve returns host's IP address: HAProxy 2.6's "add server" takes no
// host name (it would add a server with no address that never resolves).
func (b *backendSync) resolve(ctx context.Context, host string) (string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return ip.String(), nil
	}
	if !b.opts.resolve {
		return "", fmt.Errorf("%w: %q (-resolve=false)", ErrHostName, host)
	}
	if ip, ok := b.resolved[host]; ok {
		return ip, nil
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("%w: %q: %w", ErrHostName, host, err)
	}
	ip := ips[0].IP
	for _, a := range ips { // IPv4 first, as most backends listen on it
		if a.IP.To4() != nil {
			ip = a.IP
			break
		}
	}
	b.resolved[host] = ip.String()
	return ip.String(), nil
}

// exec runs one command on the backend's server, counts it as op, and
// logs it at debug level.
func (b *backendSync) exec(ctx context.Context, op, cmd string, ok ...string) error {
	if err := b.api.exec(ctx, cmd, ok...); err != nil {
		return fmt.Errorf("backend %s: %w", b.backend, err)
	}
	b.m.ops.WithLabelValues(b.backend, op).Inc()
	b.log.Debug().Str("op", op).Str("command", cmd).Msg("applied")
	return nil
}

// add adds t to the backend and enables it (and its health checks with
// -check): HAProxy adds a server in maintenance.
func (b *backendSync) add(ctx context.Context, t target) error {
	ref := b.backend + "/" + t.name
	cmd := fmt.Sprintf("add server %s %s weight %d", ref, net.JoinHostPort(t.addr, strconv.Itoa(t.port)), t.weight)
	if t.backup {
		cmd += " backup"
	}
	if b.opts.check {
		cmd += " check"
	}
	if b.opts.serverOpts != "" {
		cmd += " " + b.opts.serverOpts
	}
	if t.ssl {
		cmd += " ssl"
		if b.opts.tlsOpts != "" {
			cmd += " " + b.opts.tlsOpts
		}
	}
	if err := b.exec(ctx, "add", cmd, "New server registered."); err != nil {
		return err
	}
	h := &haServer{Name: t.name, Addr: t.addr, Port: t.port, Weight: t.weight, Backup: t.backup, SSL: t.ssl, Admin: adminForcedMaint}
	b.have[t.name] = h
	if b.opts.check {
		if err := b.exec(ctx, "enable_health", "enable health "+ref); err != nil {
			return err
		}
	}
	if err := b.exec(ctx, "enable", "enable server "+ref); err != nil {
		return err
	}
	h.Admin = 0
	b.log.Info().Str("id", t.id).Str("server", t.name).Str("addr", net.JoinHostPort(t.addr, strconv.Itoa(t.port))).
		Int("weight", t.weight).Bool("backup", t.backup).Bool("ssl", t.ssl).Msg("server added")
	return nil
}

// update changes what HAProxy can change of a listed server in place: its
// address, weight, and a maintenance or drain state (a server of a
// previous life of the sync, or one an operator set aside).
func (b *backendSync) update(ctx context.Context, h *haServer, t target) error {
	ref := b.backend + "/" + t.name
	if h.Addr != t.addr || h.Port != t.port {
		cmd := fmt.Sprintf("set server %s addr %s port %d", ref, t.addr, t.port)
		if err := b.exec(ctx, "addr", cmd, "IP changed", "port changed", "no need to change"); err != nil {
			return err
		}
		h.Addr, h.Port = t.addr, t.port
		b.log.Info().Str("id", t.id).Str("server", t.name).Str("addr", net.JoinHostPort(t.addr, strconv.Itoa(t.port))).Msg("server address changed")
	}
	if h.Weight != t.weight {
		if err := b.exec(ctx, "weight", fmt.Sprintf("set server %s weight %d", ref, t.weight)); err != nil {
			return err
		}
		b.log.Info().Str("id", t.id).Str("server", t.name).Int("weight", t.weight).Int("was", h.Weight).Msg("server weight changed")
		h.Weight = t.weight
	}
	if h.maint() || h.draining() {
		if err := b.exec(ctx, "ready", "set server "+ref+" state ready"); err != nil {
			return err
		}
		h.Admin = 0
		b.log.Info().Str("id", t.id).Str("server", t.name).Msg("server ready again")
	}
	return nil
}

// remove takes one of our servers out of the backend, one step per call.
// After a graceful departure it is drained (no new requests) until it has
// no sessions or -drain-timeout passed, then put in maintenance and
// deleted; its sessions are shut down only when the drain timed out.
// After a crash it is put in maintenance and its sessions shut down at
// once. HAProxy 2.6 deletes only a server in maintenance without
// connections: the deletion is tried again until it succeeds.
func (b *backendSync) remove(ctx context.Context, h *haServer, crash bool, now time.Time) error {
	ref := b.backend + "/" + h.Name
	l, ok := b.leaving[h.Name]
	if !ok {
		l.deadline = now.Add(b.opts.drainTimeout)
		if crash {
			l.deadline = now
		}
		if !crash && !h.maint() && !h.draining() {
			if err := b.exec(ctx, "drain", "set server "+ref+" state drain"); err != nil {
				return err
			}
			h.Admin |= adminForcedDrain
			b.log.Info().Str("server", h.Name).Dur("timeout", b.opts.drainTimeout).Msg("server draining")
			b.leaving[h.Name] = l
			return nil // its sessions are read at the next step
		}
	}
	b.leaving[h.Name] = l
	drained := h.Sessions == 0 && h.UsedConns == 0
	if !drained && now.Before(l.deadline) {
		return nil
	}
	if !h.maint() {
		if err := b.exec(ctx, "maint", "set server "+ref+" state maint"); err != nil {
			return err
		}
		h.Admin |= adminForcedMaint
	}
	if (crash || !drained) && !l.shut {
		if err := b.exec(ctx, "shutdown", "shutdown sessions server "+ref); err != nil {
			return err
		}
		l.shut = true
		b.leaving[h.Name] = l
	}
	err := b.exec(ctx, "del", "del server "+ref, "Server deleted.")
	if busy(err) {
		b.log.Debug().Err(err).Str("server", h.Name).Msg("server not deleted yet")
		return nil
	}
	if err != nil {
		return err
	}
	delete(b.have, h.Name)
	delete(b.leaving, h.Name)
	b.mu.Lock()
	delete(b.crash, h.Name)
	b.mu.Unlock()
	b.log.Info().Str("server", h.Name).Bool("crash", crash).Bool("drained", drained).Msg("server deleted")
	return nil
}

// haproxyWeight maps pushlb's weight (1 to 1,000; 0 is the default 100)
// onto HAProxy's 1 to 256: w×256/1000 rounded, at least 1, so that the
// default 100 is 26 and 1,000 is 256. Weights 1 to 5 all become 1.
func haproxyWeight(w int) int {
	if w <= 0 {
		w = balancer.DefaultWeight
	}
	h := (w*256 + 500) / 1000
	return max(1, min(h, 256))
}

// serverName is the HAProxy server name of an instance: the prefix, then
// the ID with every character HAProxy does not allow in a name replaced by
// '_', cut at 48 characters; when anything was replaced or cut, a hash of
// the whole ID follows, so that two IDs never share a name.
func (o *options) serverName(id string) string {
	var sb strings.Builder
	changed := false
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.', r == ':':
			sb.WriteRune(r)
		default:
			sb.WriteByte('_')
			changed = true
		}
	}
	s := sb.String()
	if len(s) > 48 {
		s, changed = s[:48], true
	}
	if changed || s == "" {
		h := fnv.New64a()
		h.Write([]byte(id))
		s += fmt.Sprintf("-%016x", h.Sum64())
	}
	return o.namePrefix + s
}

// ours reports whether a server is one the sync manages: its name carries
// the prefix. Every other server (the configuration's) is left alone.
func (o *options) ours(name string) bool { return strings.HasPrefix(name, o.namePrefix) }

// backup reports whether an instance of zone is added as a backup server:
// with -zone set, one whose zone is set and differs (compared without
// regard to case, as pushlb's balancers compare zones).
func (o *options) backup(zone string) bool {
	return o.zone != "" && zone != "" && !strings.EqualFold(zone, o.zone)
}
