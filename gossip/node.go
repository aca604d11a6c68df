package gossip

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Node is one member of a gossip cluster. Build it with New, start it with
// Start, stop it with Close; Leave before Close lets the others know at once
// instead of detecting a failure. Its methods are safe for concurrent use.
type Node struct {
	name    string
	cfg     Config  // as given to New
	checked checked // cfg, validated
	log     zerolog.Logger
	handler Handler
	peers   []string
	retry   JoinRetry

	meta atomic.Pointer[[]byte] // encoded wireMeta served to memberlist

	// mu guards members, queue and addr. It is taken inside memberlist's
	// callbacks, so nothing slow happens under it.
	mu       sync.Mutex
	addr     string            // advertised "host:port", set by Start
	members  map[string]Member // alive (or suspect) nodes, the local one included
	queue    []event
	wake     chan struct{} // cap 1: the queue has events
	peerGone chan struct{} // cap 1: a peer died or left; the join loop looks again

	// lifeMu serializes Start, Leave, UpdateMeta and Close, which must not
	// reach memberlist after its Shutdown (its Leave panics then); they
	// never wait on a Handler.
	lifeMu    sync.Mutex
	ml        *memberlist.Memberlist // set by Start
	localMeta Meta                   // the Meta last set, without the leaving flag
	started   bool
	left      bool
	closed    bool

	quit       chan struct{} // closed by Leave or Close: stop joining
	quitOnce   sync.Once
	done       chan struct{} // closed by Close: stop dispatching
	joined     chan struct{} // closed when another node is first seen alive
	joinedOnce sync.Once
	wg         sync.WaitGroup

	// joinFailures counts join attempts that reached no peer.
	joinFailures atomic.Uint64
}

// event is a change queued for the Handler.
type event struct {
	gone   bool
	member Member
	reason Reason
	err    error // Meta did not decode; logged and dropped
}

// New validates cfg and builds a Node. It binds nothing and starts no
// goroutine: Start does. h may be nil when only Members is wanted. Errors
// wrap ErrInvalidConfig (and ErrInvalidMeta or ErrMetaTooLarge for a bad
// Meta).
func New(cfg Config, h Handler) (*Node, error) {
	c, err := cfg.check()
	if err != nil {
		return nil, err
	}
	n := &Node{
		name:     c.name,
		cfg:      cfg,
		checked:  c,
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
	return n, nil
}

// Start creates the memberlist node, binding UDP and TCP on BindAddr, and
// starts joining Config.Join in the background; it does not wait for any
// peer (see WaitJoined). ctx bounds Start itself (resolving host names); it
// does not affect the running Node, which runs until Close.
//
// Errors wrap ErrInvalidConfig when a host name does not resolve, ErrStart
// when memberlist cannot bind or find an address to advertise, or when the
// node was already started, ErrClosed after Leave or Close, and ctx's error.
// A node whose Start failed is closed with Close like any other.
func (n *Node) Start(ctx context.Context) error {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	switch {
	case n.closed || n.left:
		return ErrClosed
	case n.started:
		return fmt.Errorf("%w: already started", ErrStart)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c, cfg := n.checked, n.cfg
	bindHost, err := resolveHost(ctx, c.bindHost)
	if err != nil {
		return invalid("BindAddr %q: %v", cfg.BindAddr, err)
	}
	advertiseHost := ""
	switch {
	case c.advertiseHost != "":
		if advertiseHost, err = resolveHost(ctx, c.advertiseHost); err != nil {
			return invalid("AdvertiseAddr %q: %v", cfg.AdvertiseAddr, err)
		}
	case isUnspecified(bindHost):
		// Advertise the address that reaches the peers; an instance that
		// joins (bindRoute) also listens there only, not on every
		// interface.
		advertiseHost = routeSource(ctx, n.peers)
		if c.bindRoute && advertiseHost != "" {
			bindHost = advertiseHost
		}
	}

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
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	n.ml = ml
	n.started = true

	// Create reported the local node to eventDelegate synchronously.
	n.mu.Lock()
	n.addr = n.members[n.name].Addr
	addr := n.addr
	n.mu.Unlock()

	n.log.Info().Str("addr", addr).Str("profile", string(c.profile)).
		Strs("join", n.peers).Msg("gossip node started")
	if len(cfg.SecretKey) == 0 && !isLoopback(bindHost) {
		n.log.Warn().Str("addr", addr).Str("bind", net.JoinHostPort(bindHost, strconv.Itoa(c.bindPort))).
			Msg("gossip has no key: anything that reaches this address can join the cluster and gossip; " +
				"give every node the same key (-gossip-key, gossip.key: base64 of 16, 24 or 32 random bytes)")
	}

	n.wg.Add(1)
	go n.dispatch()
	if len(n.peers) > 0 {
		n.wg.Add(1)
		go n.joinLoop()
	}
	return nil
}

// isUnspecified reports whether the IP literal host is 0.0.0.0 or ::.
func isUnspecified(host string) bool {
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified()
}

// routeSource returns the local address this host sends from to reach the
// first of peers that resolves, or "" when none does. A node listening on
// all interfaces advertises it, so that its peers can answer: memberlist's
// own choice, the first private address of the machine, may be one the
// peers cannot reach (an IPv6 address for a peer bound to 127.0.0.1, or
// the wrong interface of a multi-homed host). No packet is sent.
func routeSource(ctx context.Context, peers []string) string {
	for _, peer := range peers {
		if _, addr, ok := strings.Cut(peer, "/"); ok { // "name/host:port"
			peer = addr
		}
		host, port, err := net.SplitHostPort(peer)
		if err != nil {
			host, port = peer, strconv.Itoa(DefaultPort)
		}
		ip, err := resolveHost(ctx, host)
		if err != nil {
			continue
		}
		conn, err := net.Dial("udp", net.JoinHostPort(ip, port))
		if err != nil {
			continue
		}
		local, _ := conn.LocalAddr().(*net.UDPAddr)
		conn.Close()
		if local != nil && !local.IP.IsUnspecified() {
			return local.IP.String()
		}
	}
	return ""
}

// isLoopback reports whether the IP literal host is a loopback address.
func isLoopback(host string) bool {
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Name returns the local node's name.
func (n *Node) Name() string { return n.name }

// LocalAddr returns the address other nodes reach this one at, "host:port",
// with the actual port when BindAddr asked for port 0; "" before Start.
func (n *Node) LocalAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addr
}

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
// error when ctx ends first, and ErrClosed when the node leaves or is closed
// first.
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
		return ErrClosed
	}
}

// UpdateMeta replaces the local node's Meta and gossips it; the others get
// NodeAlive with the new Meta. It waits up to timeout (zero or less means
// DefaultBroadcastTimeout) for the update to be sent to a peer. Errors wrap
// ErrInvalidMeta or ErrMetaTooLarge for a bad meta, ErrClosed after Leave
// or Close, and ErrTimeout when the broadcast did not go out in time (the
// update still spreads later). Before Start it only replaces the Meta that
// Start will gossip (the node's name stays the one New derived).
func (n *Node) UpdateMeta(m Meta, timeout time.Duration) error {
	b, err := m.encode(false)
	if err != nil {
		return err
	}
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.closed || n.left {
		return ErrClosed
	}
	n.localMeta = m
	n.meta.Store(&b)
	if !n.started {
		return nil
	}
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
// reports ReasonDead instead. The node keeps running until Close, which
// should follow. Leave is separate from Close because it waits on the
// network, bounded by its own timeout; Close alone is a crash to the others.
// Calling Leave again, or before Start, does nothing (a node that left
// cannot Start). Errors wrap ErrClosed after Close and ErrTimeout when a
// broadcast did not go out in time.
func (n *Node) Leave(timeout time.Duration) error {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.closed {
		return ErrClosed
	}
	if n.left {
		return nil
	}
	n.left = true
	n.stopJoining()
	if !n.started {
		return nil
	}
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

// Close stops the node without telling anyone: the others detect a
// failure, as for a crash, unless Leave came first. It closes the sockets,
// stops the node's goroutines and waits for them: for a Handler call in
// progress, and for a join attempt in progress, which gives up after the
// profile's TCP timeout (10 s for lan, 2 s for fast) when a peer does not
// answer. Queued events are dropped; no Handler call happens after Close
// returns. Close is idempotent, may be called before Start, and must not be
// called from a Handler. It returns the error of memberlist's shutdown, if
// any (the node is closed all the same).
func (n *Node) Close() error {
	n.lifeMu.Lock()
	if n.closed {
		n.lifeMu.Unlock()
		return nil
	}
	n.closed = true
	n.stopJoining()
	close(n.done)
	var err error
	if n.ml != nil {
		if e := n.ml.Shutdown(); e != nil {
			err = fmt.Errorf("gossip: close: %w", e)
		}
	}
	started := n.started
	n.lifeMu.Unlock()
	n.wg.Wait()
	if started {
		n.log.Info().Msg("gossip node stopped")
	}
	return err
}

func (n *Node) stopJoining() {
	n.quitOnce.Do(func() { close(n.quit) })
}

// dispatch hands queued events to the Handler, one at a time, in order,
// until Close.
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
