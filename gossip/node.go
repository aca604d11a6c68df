package gossip

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Node is one running member of a gossip cluster. Its methods are safe for
// concurrent use. Call Shutdown when done; Leave first to let the others
// know at once instead of detecting a failure.
type Node struct {
	name    string
	addr    string // advertised "host:port", fixed at Start
	log     zerolog.Logger
	handler Handler
	peers   []string
	retry   JoinRetry
	ml      *memberlist.Memberlist

	meta atomic.Pointer[[]byte] // encoded wireMeta served to memberlist

	// mu guards members and queue. It is taken inside memberlist's
	// callbacks, so nothing slow happens under it.
	mu       sync.Mutex
	members  map[string]Member // alive (or suspect) nodes, the local one included
	queue    []event
	wake     chan struct{} // cap 1: the queue has events
	peerGone chan struct{} // cap 1: a peer died or left; the join loop looks again

	// lifeMu serializes Leave, UpdateMeta and Shutdown, which must not reach
	// memberlist after its Shutdown (its Leave panics then).
	lifeMu    sync.Mutex
	localMeta Meta // the Meta last set, without the leaving flag
	left      bool
	stopped   bool

	quit       chan struct{} // closed by Leave or Shutdown: stop joining
	quitOnce   sync.Once
	done       chan struct{} // closed by Shutdown: stop dispatching
	joined     chan struct{} // closed when another node is first seen alive
	joinedOnce sync.Once
	wg         sync.WaitGroup
}

// event is a change queued for the Handler.
type event struct {
	gone   bool
	member Member
	reason Reason
	err    error // Meta did not decode; logged and dropped
}

// Start validates cfg, creates the memberlist node (binding UDP and TCP on
// BindAddr), and starts joining cfg.Join in the background; it does not wait
// for any peer (see WaitJoined). ctx bounds Start itself (resolving host
// names); it does not affect the returned Node, which runs until Shutdown.
// h may be nil when only Members is wanted.
//
// Errors wrap ErrInvalidConfig for a bad cfg and ErrStart when memberlist
// cannot bind or find an address to advertise.
func Start(ctx context.Context, cfg Config, h Handler) (*Node, error) {
	c, err := cfg.check()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	bindHost, err := resolveHost(ctx, c.bindHost)
	if err != nil {
		return nil, invalid("BindAddr %q: %v", cfg.BindAddr, err)
	}
	advertiseHost := ""
	if c.advertiseHost != "" {
		if advertiseHost, err = resolveHost(ctx, c.advertiseHost); err != nil {
			return nil, invalid("AdvertiseAddr %q: %v", cfg.AdvertiseAddr, err)
		}
	}

	n := &Node{
		name:     c.name,
		log:      cfg.Logger.With().Str("component", "gossip").Str("node", c.name).Logger(),
		handler:  h,
		peers:    slices.Clone(cfg.Join),
		retry:    c.retry,
		members:  make(map[string]Member),
		wake:     make(chan struct{}, 1),
		peerGone: make(chan struct{}, 1),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		joined:   make(chan struct{}),
	}
	n.meta.Store(&c.meta)
	n.localMeta = cfg.Meta

	mc := c.profile.memberlistConfig()
	mc.Name = c.name
	mc.BindAddr = bindHost
	mc.BindPort = c.bindPort
	mc.AdvertiseAddr = advertiseHost
	mc.AdvertisePort = c.advertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = c.bindPort // memberlist replaces it when bindPort is 0
	}
	mc.SecretKey = bytes.Clone(cfg.SecretKey)
	mc.Label = cfg.Label
	mc.Delegate = metaDelegate{n}
	mc.Events = eventDelegate{n}
	mc.LogOutput = nil
	mc.Logger = log.New(logWriter{n.log}, "", 0)

	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStart, err)
	}
	n.ml = ml

	// Create reported the local node to eventDelegate synchronously.
	n.mu.Lock()
	n.addr = n.members[n.name].Addr
	n.mu.Unlock()

	n.log.Info().Str("addr", n.addr).Str("profile", string(c.profile)).
		Strs("join", n.peers).Msg("gossip node started")

	n.wg.Add(1)
	go n.dispatch()
	if len(n.peers) > 0 {
		n.wg.Add(1)
		go n.joinLoop()
	}
	return n, nil
}

// Name returns the local node's name.
func (n *Node) Name() string { return n.name }

// LocalAddr returns the address other nodes reach this one at, "host:port",
// with the actual port when BindAddr asked for port 0.
func (n *Node) LocalAddr() string { return n.addr }

// Members returns the nodes currently alive or suspect, sorted by name: the
// local one (until Leave) and every other whose Meta is valid. The slice is
// the caller's.
func (n *Node) Members() []Member {
	n.mu.Lock()
	out := make([]Member, 0, len(n.members))
	for _, m := range n.members {
		out = append(out, m)
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// NumMembers returns len(Members()) without copying: 1 for a node alone.
// It never blocks on memberlist.
func (n *Node) NumMembers() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.members)
}

// WaitJoined waits until this node has seen at least one other node alive,
// whether it joined a peer or a peer joined it. It returns nil then, ctx's
// error when ctx ends first, and ErrStopped when the node leaves or shuts
// down first.
func (n *Node) WaitJoined(ctx context.Context) error {
	select {
	case <-n.joined:
		return nil
	default:
	}
	select {
	case <-n.joined:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.quit:
		return ErrStopped
	}
}

// UpdateMeta replaces the local node's Meta and gossips it; the others get
// NodeAlive with the new Meta. It waits up to timeout (zero or less means
// DefaultBroadcastTimeout) for the update to be sent to a peer. Errors wrap
// ErrInvalidMeta or ErrMetaTooLarge for a bad meta, ErrStopped after Leave
// or Shutdown, and ErrTimeout when the broadcast did not go out in time (the
// update still spreads later).
func (n *Node) UpdateMeta(m Meta, timeout time.Duration) error {
	b, err := m.encode(false)
	if err != nil {
		return err
	}
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.stopped || n.left {
		return ErrStopped
	}
	n.localMeta = m
	n.meta.Store(&b)
	if err := n.ml.UpdateNode(orDefault(timeout)); err != nil {
		return fmt.Errorf("%w: update meta: %v", ErrTimeout, err)
	}
	return nil
}

// Leave tells the cluster that this node is going away on purpose, so the
// others report it with ReasonLeft at once instead of detecting a failure.
// It stops the background join, gossips a leave flag in its Meta, then
// memberlist's leave message, waiting up to timeout in all (zero or less
// means DefaultBroadcastTimeout) for both to go out; about two gossip rounds
// with peers, nothing when alone. A peer that missed the flag (packet loss)
// reports ReasonDead instead. The node keeps running until Shutdown, which
// should follow. Calling Leave again does nothing. Errors wrap ErrStopped
// after Shutdown and ErrTimeout when a broadcast did not go out in time.
func (n *Node) Leave(timeout time.Duration) error {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.stopped {
		return ErrStopped
	}
	if n.left {
		return nil
	}
	n.left = true
	n.stopJoining()
	deadline := time.Now().Add(orDefault(timeout))

	b, err := n.localMeta.encode(true) // validated at Start or UpdateMeta
	if err != nil {
		return err
	}
	n.meta.Store(&b)
	if err := n.ml.UpdateNode(time.Until(deadline)); err != nil {
		return fmt.Errorf("%w: leave flag: %v", ErrTimeout, err)
	}
	remaining := time.Until(deadline)
	if remaining <= 0 {
		return fmt.Errorf("%w: leave: no time left after the leave flag", ErrTimeout)
	}
	if err := n.ml.Leave(remaining); err != nil {
		return fmt.Errorf("%w: leave: %v", ErrTimeout, err)
	}
	n.log.Info().Msg("gossip node left")
	return nil
}

func orDefault(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		return DefaultBroadcastTimeout
	}
	return timeout
}

// Shutdown stops the node without telling anyone: the others detect a
// failure, as for a crash, unless Leave came first. It closes the sockets,
// stops the node's goroutines and waits for them: for a Handler call in
// progress, and for a join attempt in progress, which gives up after the
// profile's TCP timeout (10 s for lan, 2 s for fast) when a peer does not
// answer. Queued events are dropped. Shutdown is idempotent and must not be
// called from a Handler.
func (n *Node) Shutdown() {
	n.lifeMu.Lock()
	if n.stopped {
		n.lifeMu.Unlock()
		return
	}
	n.stopped = true
	n.stopJoining()
	close(n.done)
	if err := n.ml.Shutdown(); err != nil {
		n.log.Warn().Err(err).Msg("memberlist shutdown")
	}
	n.lifeMu.Unlock()
	n.wg.Wait()
	n.log.Info().Msg("gossip node stopped")
}

func (n *Node) stopJoining() {
	n.quitOnce.Do(func() { close(n.quit) })
}

// dispatch hands queued events to the Handler, one at a time, in order,
// until Shutdown.
func (n *Node) dispatch() {
	defer n.wg.Done()
	announced := make(map[string]Member) // what the Handler was told is alive
	for {
		select {
		case <-n.done:
			return
		case <-n.wake:
		}
		for {
			n.mu.Lock()
			batch := n.queue
			n.queue = nil
			n.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, ev := range batch {
				select {
				case <-n.done:
					return
				default:
				}
				n.deliver(ev, announced)
			}
		}
	}
}

func (n *Node) deliver(ev event, announced map[string]Member) {
	name := ev.member.Name
	if ev.err != nil {
		n.log.Warn().Err(ev.err).Str("peer", name).Str("peer_addr", ev.member.Addr).
			Msg("ignoring gossip node with invalid meta")
		return
	}
	if ev.gone {
		m, ok := announced[name]
		if !ok {
			return
		}
		delete(announced, name)
		n.log.Debug().Str("peer", name).Str("reason", string(ev.reason)).Msg("gossip node gone")
		if n.handler != nil {
			n.handler.NodeGone(m, ev.reason)
		}
		return
	}
	announced[name] = ev.member
	n.log.Debug().Str("peer", name).Str("peer_addr", ev.member.Addr).Msg("gossip node alive")
	if n.handler != nil {
		n.handler.NodeAlive(ev.member)
	}
}

// metaDelegate serves the local Meta to memberlist; the rest of
// memberlist.Delegate (user messages and state) is unused.
type metaDelegate struct{ n *Node }

func (d metaDelegate) NodeMeta(limit int) []byte {
	b := *d.n.meta.Load()
	if len(b) > limit { // checked at Start and UpdateMeta; never expected
		return nil
	}
	return b
}
func (metaDelegate) NotifyMsg([]byte)                           {}
func (metaDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (metaDelegate) LocalState(join bool) []byte                { return nil }
func (metaDelegate) MergeRemoteState(buf []byte, join bool)     {}

// eventDelegate receives memberlist's membership changes. memberlist calls it
// synchronously, holding its node lock, from its packet, stream and timer
// goroutines (never two calls at once): it only records and queues.
type eventDelegate struct{ n *Node }

func (d eventDelegate) NotifyJoin(node *memberlist.Node)   { d.n.observe(node, false) }
func (d eventDelegate) NotifyUpdate(node *memberlist.Node) { d.n.observe(node, false) }
func (d eventDelegate) NotifyLeave(node *memberlist.Node)  { d.n.observe(node, true) }

func (n *Node) observe(node *memberlist.Node, gone bool) {
	meta, leaving, err := decodeMeta(node.Meta)
	ev := event{
		gone:   gone,
		member: Member{Name: node.Name, Addr: node.Address(), Meta: meta},
		err:    err,
	}
	if gone {
		// node.State is not set by memberlist (see wireMeta): a node that
		// flagged its leave first has left, any other was declared dead.
		ev.reason = ReasonDead
		if leaving {
			ev.reason = ReasonLeft
		}
		ev.err = nil // reported with the Meta last announced, if any
	}
	self := node.Name == n.name
	// The leave flag alone is no news for the Handler: the leave follows.
	queue := !self && (gone || !leaving)

	n.mu.Lock()
	switch {
	case gone:
		delete(n.members, node.Name)
	case err == nil:
		n.members[node.Name] = ev.member
	}
	if queue {
		n.queue = append(n.queue, ev)
	}
	n.mu.Unlock()

	if !queue {
		return
	}
	select {
	case n.wake <- struct{}{}:
	default:
	}
	if gone {
		select {
		case n.peerGone <- struct{}{}:
		default:
		}
	} else if err == nil {
		n.joinedOnce.Do(func() { close(n.joined) })
	}
}

var (
	_ memberlist.Delegate      = metaDelegate{}
	_ memberlist.EventDelegate = eventDelegate{}
)
