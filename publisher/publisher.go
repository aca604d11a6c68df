package publisher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/serverlist"
)

var (
	// ErrInvalidConfig wraps configuration errors.
	ErrInvalidConfig = errors.New("publisher: invalid config")
	// ErrNotAnnounced is returned by Withdraw before Announce.
	ErrNotAnnounced = errors.New("publisher: not announced")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("publisher: closed")
	// ErrReplaced is returned by Withdraw once the instance was replaced by
	// a newer process (see Publisher.Replaced): there is nothing left to
	// withdraw.
	ErrReplaced = errors.New("publisher: replaced by a newer process")
)

// Config configures a Publisher. Zero values take the defaults.
type Config struct {
	// Prefix is the subject prefix. Default (empty): the registry's
	// (serverlist.RegistryConfig.Prefix), so a program gives it once; a
	// different one is an error.
	Prefix string
	// LeaseInterval is how often the instance's lease is renewed. Default:
	// a third of the registry's TTL, so two renewals may fail before the
	// lease runs out.
	LeaseInterval time.Duration
	// Logger receives lease and re-announce failures. Zero: no logs. Every
	// line about the instance names it (fields service and id), as the
	// registry's do: a program that announces one instance gives a logger
	// without those fields, or its lines name them twice. (The gossip
	// node's lines, which do not name them, go to Gossip.Logger.)
	Logger zerolog.Logger
	// Gossip, when set, makes the instance a gossip (memberlist) member
	// from its announcement to its withdrawal, so gateways that are members
	// too notice a crash within the profile's detection time instead of the
	// lease's. Announce fills in its Meta (and so the node name), starts the
	// node before the registry put and records the node's name and address
	// in the entry (Instance.GossipNode, GossipAddr), since gateways accept
	// gossip about the instance only from that node. An empty BindAddr binds
	// a free port (see gossip.Config). Withdraw leaves the cluster
	// gracefully; Close closes the node without leaving, which gateways see
	// as a crash.
	Gossip *gossip.Config
	// Replace makes Announce take the instance ID over even when another
	// live process holds it; that process yields (see Publisher.Replaced).
	// Without it, Announce refuses a live holder's ID with an error
	// wrapping serverlist.ErrInUse and writes nothing: a holder that
	// answers a probe (a TCP connect to the gossip node its record names,
	// else to its service address, confirmed over 200 ms) is refused at
	// once, one that refreshes its record within ClaimProbe when it does
	// not. An address that is the announced instance's own (its service
	// address, its gossip node's) is not probed.
	Replace bool
	// ClaimProbe is how long Announce watches a record of another owner for
	// a refresh before it presumes its holder dead (a crash whose lease has
	// not run out). Zero means half the registry's TTL. See
	// serverlist.Registry.Claim, and ClaimWait for the timeout of Announce.
	ClaimProbe time.Duration
	// OnClaimWait, when set, is called when Announce finds the ID held by
	// another process's record and starts watching it, with that record and
	// the longest wait (ClaimProbe): the restart of a crashed instance waits
	// there until its predecessor's record proves dead. The wait is also
	// logged (info) to the registry's logger; Announce's ctx bounds it.
	OnClaimWait func(held serverlist.Instance, wait time.Duration)
}

// Publisher announces one instance. Its methods are safe for concurrent
// use. New builds it without starting anything; Announce starts the lease
// loop (and the gossip node); Withdraw announces the instance offline;
// Close stops the lease loop and the gossip node without withdrawing.
type Publisher struct {
	nc  *nats.Conn
	reg *serverlist.Registry
	cfg Config
	log zerolog.Logger

	mu        sync.Mutex
	inst      serverlist.Instance
	announced bool
	// down says a MarkDown took the announced instance out (offline event,
	// record removed) until MarkUp; the lease loop does not run meanwhile.
	down     bool
	closed   bool
	cancel   context.CancelFunc
	done     chan struct{}
	node     *gossip.Node // the gossip member of the current incarnation, or nil
	nodeMeta gossip.Meta
	attempt  serverlist.Instance // the last instance Announce tried to claim

	// owner names this process in its record (serverlist.Instance.Owner).
	owner string
	// replaced is closed once a newer process replaced the instance.
	replaced     chan struct{}
	replacedOnce sync.Once
	replacedBy   atomic.Pointer[serverlist.Instance]
}

// New builds a Publisher. It publishes nothing and starts no goroutine
// until Announce.
func New(nc *nats.Conn, reg *serverlist.Registry, cfg Config) (*Publisher, error) {
	if nc == nil || reg == nil {
		return nil, fmt.Errorf("%w: nil connection or registry", ErrInvalidConfig)
	}
	// The registry was opened for one deployment's prefix: events go out
	// under the same, given once.
	switch regPrefix := reg.Config().Prefix; {
	case cfg.Prefix == "":
		cfg.Prefix = regPrefix
	case cfg.Prefix != regPrefix:
		return nil, fmt.Errorf("%w: prefix %q, but the registry was opened for %q (leave Prefix empty to take the registry's)", ErrInvalidConfig, cfg.Prefix, regPrefix)
	}
	if err := events.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	ttl := reg.Config().TTL
	if cfg.LeaseInterval == 0 {
		cfg.LeaseInterval = ttl / 3
	}
	if cfg.LeaseInterval <= 0 || cfg.LeaseInterval >= ttl {
		return nil, fmt.Errorf("%w: lease interval %v must be positive and below the registry TTL %v", ErrInvalidConfig, cfg.LeaseInterval, ttl)
	}
	warnSlowPings(nc, ttl, cfg.Logger)
	return &Publisher{nc: nc, reg: reg, cfg: cfg, log: cfg.Logger, owner: newOwner(), replaced: make(chan struct{})}, nil
}

// Instance returns the instance as last announced.
func (p *Publisher) Instance() serverlist.Instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inst.Clone()
}

// Announce claims the instance's ID in the registry, publishes it online,
// then keeps its lease alive until Withdraw or Close. Announcing again
// replaces the instance (a new incarnation if the caller sets one): to
// change a live instance's weight (Instance.Weight) or metadata, announce it
// again with the new values; gateways apply the record update as any other.
//
// The ID must be free, or held by this publisher: a record of another live
// process is refused with an error wrapping serverlist.ErrInUse, at once
// when its holder answers at its address, else after watching it for up to
// Config.ClaimProbe, unless Config.Replace is set (see
// serverlist.Registry.Claim). A ctx that ends before ClaimWait plus the
// time of the network operations may cut the wait of a restart after a
// crash short. in.Owner is set to this publisher's token.
// A successful Announce ends a MarkDown.
func (p *Publisher) Announce(ctx context.Context, in serverlist.Instance) error {
	if in.Incarnation == 0 {
		in.Incarnation = time.Now().UnixNano()
	}
	in.Owner = p.owner
	// The record names the connection that holds it, so that the server's
	// advisory of its end tells the gateways to probe the instance.
	c := connectionOf(p.nc)
	in.NATSServerID, in.NATSClientID = c.ServerID, c.ClientID
	if err := in.Validate(); err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	// The events carry the region: one they cannot carry is refused
	// before anything is written.
	if in.Region != "" {
		if err := events.ValidateRegion(in.Region); err != nil {
			return fmt.Errorf("publisher: %w: region: %w", serverlist.ErrInvalidInstance, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.stopLeaseLocked()
	// The gossip node starts first, so that the record names it: gateways
	// accept gossip about the instance only from that node.
	in = p.joinGossipLocked(ctx, in)
	p.attempt = in
	claimed, registered, err := p.announce(ctx, in, p.cfg.Replace)
	if registered {
		// From the registry put on, gateways may route to the instance
		// (the registry is the truth), even if the online event failed or
		// ctx ended while flushing it: Withdraw must clean up, and the
		// lease must be kept.
		p.inst, p.announced, p.down = in.Clone(), true, false
		p.startLeaseLocked(claimed)
	} else if errors.Is(err, serverlist.ErrInUse) {
		// Refused: this process holds nothing, not even a gossip node
		// naming the ID.
		p.leaveGossipLocked()
	}
	return err
}

// joinGossipLocked makes the instance's current incarnation a gossip
// member and returns in with the node's name and address (GossipNode,
// GossipAddr) filled in, for the record. Without Config.Gossip, in is
// returned as given. A failure is logged, not returned: the instance is
// announced without a gossip node, and the lease still removes it after a
// crash.
func (p *Publisher) joinGossipLocked(ctx context.Context, in serverlist.Instance) serverlist.Instance {
	if p.cfg.Gossip == nil {
		return in
	}
	in.GossipNode, in.GossipAddr = "", ""
	meta := gossip.Meta{Role: gossip.RoleInstance, Service: in.Service, InstanceID: in.InstanceID, Incarnation: in.Incarnation}
	if p.node != nil {
		if p.nodeMeta == meta {
			in.GossipNode, in.GossipAddr = p.node.Name(), p.node.LocalAddr()
			return in
		}
		p.leaveGossipLocked()
	}
	cfg := *p.cfg.Gossip
	cfg.Meta = meta
	n, err := gossip.New(cfg, gossip.HandlerFuncs{})
	if err == nil {
		if err = n.Start(ctx); err != nil {
			n.Close()
		}
	}
	if err != nil {
		p.log.Error().Err(err).Str("service", in.Service).Str("id", in.InstanceID).Msg("gossip did not start; crash detection falls back to the registry lease")
		return in
	}
	p.node, p.nodeMeta = n, meta
	p.log.Info().Str("service", in.Service).Str("id", in.InstanceID).Str("gossip", n.LocalAddr()).Str("gossip_node", n.Name()).Strs("join", cfg.Join).Str("profile", string(cfg.Profile)).Msg("gossip member")
	in.GossipNode, in.GossipAddr = n.Name(), n.LocalAddr()
	return in
}

// gossipLeaveTimeout bounds a graceful gossip leave.
const gossipLeaveTimeout = time.Second

// leaveGossipLocked leaves the cluster gracefully: gateways see the node
// leave at once instead of suspecting it. Failures are logged: the offline
// event and the deregistration already told the gateways.
func (p *Publisher) leaveGossipLocked() {
	if p.node == nil {
		return
	}
	if err := p.node.Leave(gossipLeaveTimeout); err != nil {
		p.log.Warn().Err(err).Str("service", p.nodeMeta.Service).Str("id", p.nodeMeta.InstanceID).Msg("gossip leave")
	}
	if err := p.node.Close(); err != nil {
		p.log.Warn().Err(err).Str("service", p.nodeMeta.Service).Str("id", p.nodeMeta.InstanceID).Msg("gossip close")
	}
	p.node = nil
}

// GossipAddr returns the address of the instance's gossip node, or "".
func (p *Publisher) GossipAddr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.node == nil {
		return ""
	}
	return p.node.LocalAddr()
}

// announce puts the registry entry, then publishes online and flushes, so
// when it returns the event has reached the NATS server. registered
// reports whether the registry put succeeded.
// replace takes the ID over from a live holder (Config.Replace).
func (p *Publisher) announce(ctx context.Context, in serverlist.Instance, replace bool) (c serverlist.Claimed, registered bool, err error) {
	c, err = p.claim(ctx, in, replace)
	if err != nil && c.Record == 0 {
		return c, false, fmt.Errorf("publisher: announce %s/%s: %w", in.Service, in.InstanceID, err)
	}
	if err != nil {
		// The record is written but its lease is not started: the lease
		// loop starts it at its first refresh.
		p.log.Warn().Err(err).Str("service", in.Service).Str("id", in.InstanceID).Msg("lease not started; retrying at the next refresh")
	}
	if err := p.publish(ctx, in, events.Online, ""); err != nil {
		return c, true, fmt.Errorf("publisher: announce %s/%s: %w", in.Service, in.InstanceID, err)
	}
	return c, true, nil
}

// publish publishes an event of in. The event carries the instance's
// region, so that a gateway of another region, to which NATS forwards it,
// leaves its own instance of the same ID alone (docs/protocol.md,
// "Regions").
func (p *Publisher) publish(ctx context.Context, in serverlist.Instance, k events.Kind, reason string) error {
	subject, data, err := events.EncodeMessage(p.cfg.Prefix, events.Event{
		Kind: k, Service: in.Service, InstanceID: in.InstanceID,
		Incarnation: in.Incarnation, At: time.Now(), Reason: reason, Region: in.Region,
	})
	if err != nil {
		return err
	}
	if err := p.nc.Publish(subject, data); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	// FlushWithContext needs a deadline: give one when ctx has none.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	if err := p.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("flush %s: %w", subject, err)
	}
	return nil
}

// Withdraw publishes the offline event, so gateways stop routing at once,
// then deregisters the instance: it removes the record only if it is still
// this publisher's, never one another process wrote. The lease loop stops
// first, so no refresh can bring the entry back.
//
// Before a successful Announce it returns ErrNotAnnounced, after removing
// a record a half-done announcement may have left (only if this publisher's
// own). Once the instance was replaced by a newer process it returns
// ErrReplaced and touches neither the registry nor the events: the ID is
// the newer process's now. While the instance is down (MarkDown), the
// offline event went out already: Withdraw removes what is left (the
// record if MarkDown failed to, the gossip membership).
func (p *Publisher) Withdraw(ctx context.Context, reason string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replacedBy.Load() != nil {
		p.stopLeaseLocked()
		p.announced = false
		p.leaveGossipLocked()
		return ErrReplaced
	}
	if !p.announced {
		if in := p.attempt; in.Service != "" {
			// A signal may have cut an announcement short after its write.
			if err := p.reg.DeregisterOwned(ctx, in.Service, in.InstanceID, p.owner); err != nil {
				return fmt.Errorf("%w (removing a half-done registration: %w)", ErrNotAnnounced, err)
			}
		}
		return ErrNotAnnounced
	}
	p.stopLeaseLocked()
	in := p.inst
	p.announced = false
	var perr error
	if p.down {
		// MarkDown already published the offline event; the record,
		// marked down, goes now.
		p.down = false
	} else {
		perr = p.publish(ctx, in, events.Offline, reason)
	}
	derr := p.reg.DeregisterOwned(ctx, in.Service, in.InstanceID, p.owner)
	p.leaveGossipLocked()
	if perr != nil || derr != nil {
		return fmt.Errorf("publisher: withdraw %s/%s: %w", in.Service, in.InstanceID, errors.Join(perr, derr))
	}
	return nil
}

// Close stops the lease loop and closes the gossip node, without
// withdrawing: the entry expires after the registry's TTL unless another
// process refreshes it, and gossip members see a crash. It waits for the
// publisher's goroutines and is idempotent; Announce after Close returns
// ErrClosed. The error is the gossip node's, if closing it failed.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.stopLeaseLocked()
	if p.node == nil {
		return nil
	}
	err := p.node.Close()
	p.node = nil
	if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	return nil
}

func (p *Publisher) startLeaseLocked(c serverlist.Claimed) {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	go p.lease(ctx, p.inst.Clone(), leaseState{Claimed: c}, p.done)
}

func (p *Publisher) stopLeaseLocked() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	p.cancel, p.done = nil, nil
}
