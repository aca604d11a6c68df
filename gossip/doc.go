// Package gossip notices crashed processes and frozen hosts in under a
// second, through hashicorp/memberlist's SWIM gossip with Lifeguard. (A
// crashed process is reported faster still, in milliseconds, by the NATS
// server's client-disconnect advisory, which a gateway confirms with a probe:
// see the subscriber package. A frozen host keeps its connections open, and
// only gossip or the lease notice it.)
//
// pushlb instances announce themselves online and offline over NATS, but a
// crashed instance announces nothing. So instances and gateways also form a
// gossip cluster: every node probes the others over UDP, suspects a node that
// stops answering, and declares it dead unless it refutes in time. A gateway
// learns of the death through its Handler and drops the instance, using the
// Meta the instance gossiped (service, instance ID, incarnation), long before
// the instance's registry lease expires.
//
// # Use
//
//	node, err := gossip.New(gossip.Config{
//		// BindAddr empty: an instance that joins binds a free port.
//		Join:     []string{"gw-1.internal:7946", "gw-2.internal:7946"},
//		Profile:  gossip.ProfileFast,
//		Meta: gossip.Meta{Role: gossip.RoleInstance, Service: "orders",
//			InstanceID: "10.0.0.7:orders:9001", Incarnation: startNanos},
//		SecretKey: key, // 16, 24 or 32 bytes; the same on every node
//		Logger:    log,
//	}, gossip.HandlerFuncs{
//		Gone: func(m gossip.Member, r gossip.Reason) { ... },
//	})
//	err = node.Start(ctx)
//	...
//	node.Leave(time.Second) // peers see ReasonLeft at once
//	node.Close()
//
// # Lifecycle
//
// New validates the Config and builds the Node without touching the
// network. Start binds real UDP and TCP sockets and returns at once: joining
// runs in the background with exponential backoff (JoinRetry) until a peer
// answers, and again whenever the node finds itself alone, so a node started
// before its peers, or outliving all of them, is not an error. WaitJoined
// waits for company when that matters. Close stops the node and waits for
// its goroutines; it is idempotent. Close alone looks like a crash to the
// others; Leave, which takes a timeout because it waits for its broadcasts
// to go out, tells them first. Config.Validate checks a Config as New does;
// every error wraps a sentinel from errors.go.
//
// # Names and metadata
//
// Node names must be unique and memberlist refuses an old name from a new
// address, so each start of a process gets a new name: an instance is
// "<service>/<instanceId>/<incarnation>", a gateway
// "gateway-<hostname>-<random>"; over MaxNodeNameLength bytes a name is cut
// and ends in a hash (see DefaultNodeName). Meta is gossiped as JSON in
// memberlist's node metadata and must fit in its 512 bytes (MaxMetaSize).
//
// # Ports
//
// A gateway, or any node the others join (a seed), binds the fixed
// DefaultPort 7946 unless told otherwise. An instance that joins binds a
// free port, so any number of instances share a host, and advertises the
// address it reaches its first peer from. Nobody needs to know an
// instance's port in advance: the instance publishes its node's name and
// address (Node.Name, Node.LocalAddr) in its registry record.
//
// # Events and threading
//
// memberlist reports joins, leaves and updates synchronously from its own
// goroutines while it holds its node lock. The Node only records them (for
// Members) and queues them; one goroutine owned by the Node drains the queue
// and calls the Handler, one call at a time, in order. A slow Handler delays
// later events but never gossip or failure detection. Close waits for that
// goroutine, and for a join attempt in progress; no Handler call happens
// after Close returns.
//
// NodeGone's Reason tells a crash (ReasonDead) from a graceful Leave
// (ReasonLeft). memberlist does not pass that difference to its event
// delegate (Node.State is never set: hashicorp/memberlist issues #266 and
// #293), so, as Serf does with its leave intents, Leave first gossips a
// leave flag in the node's metadata and then memberlist's leave message; a
// node that saw the flag reports ReasonLeft. A node that missed it, through
// packet loss, reports ReasonDead: gone either way.
//
// # Detection time
//
// From a crash to a survivor's NodeGone(ReasonDead) three things happen:
//
//  1. A probe of the crashed node fails. Each survivor probes one peer per
//     ProbeInterval, taking its peers in a shuffled round, so among N-1
//     survivors one probe reaches the crashed node within about one
//     ProbeInterval; the probe waits ProbeTimeout for an ack, then asks
//     IndirectChecks peers and tries TCP until the interval ends, and the
//     prober marks the node suspect: about 2·ProbeInterval after the crash.
//
//  2. The suspicion runs out. memberlist's suspicion timeout is
//
//     SuspicionTimeout = SuspicionMult · max(1, log10(max(1, N))) · ProbeInterval
//
//     (the code's formula; memberlist's Config comment says log(N+1)). Its
//     timer starts at SuspicionMaxTimeoutMult · SuspicionTimeout and
//     shrinks, logarithmically in the number of independent confirmations
//     (other survivors whose own probes fail, about one per ProbeInterval),
//     down to SuspicionTimeout once k = SuspicionMult-2 have arrived. When
//     fewer than k other nodes exist (N-2 < k), it is SuspicionTimeout from
//     the start. This is Lifeguard's trade: a live node that is slow has
//     time to refute, a dead one is confirmed quickly by the crowd.
//
//  3. The dead message spreads: a few GossipIntervals (each survivor also
//     runs its own timer).
//
// So Profile.DetectionTime gives expected = 2·ProbeInterval +
// SuspicionTimeout + GossipInterval, and bound = 3·ProbeInterval +
// SuspicionMaxTimeoutMult·SuspicionTimeout + 2·GossipInterval, which holds
// unless several probe rounds in a row miss the crashed node or no survivor
// confirms.
//
// ProfileLAN is memberlist.DefaultLANConfig: ProbeInterval 1 s, ProbeTimeout
// 500 ms, SuspicionMult 4 (k = 2), SuspicionMaxTimeoutMult 6, GossipInterval
// 200 ms to 3 nodes, push/pull every 30 s. ProfileFast: ProbeInterval 100 ms,
// ProbeTimeout 50 ms, IndirectChecks 3, SuspicionMult 3 (k = 1),
// SuspicionMaxTimeoutMult 2, GossipInterval 50 ms to 4 nodes, RetransmitMult
// 4, push/pull every 10 s, GossipToTheDeadTime 10 s, TCPTimeout 2 s. It sends
// ten times the probes of LAN: for N = 50, about 500 small UDP probes a
// second across the cluster, plus gossip only while there is news.
//
// Documented (Profile.DetectionTime) and measured on loopback
// (BenchmarkDetection, 2 cores: fast 10 crashes, lan 3 crashes per size; time
// to the observer's NodeGone, p50 / p99):
//
//	profile  N   SuspicionTimeout  max timeout  expected  bound    measured p50 / p99
//	fast      5  0.30 s            0.60 s       0.55 s     1.00 s   0.54 s / 0.63 s
//	fast     20  0.39 s            0.78 s       0.64 s     1.18 s   0.60 s / 0.77 s
//	fast     50  0.51 s            1.02 s       0.76 s     1.42 s   (not measured: see below)
//	lan       5  4.00 s           24.0 s        6.2 s     27.4 s    5.8 s / 7.6 s
//	lan      20  5.20 s           31.2 s        7.4 s     34.6 s    7.3 s / 7.6 s
//	lan      50  6.79 s           40.8 s        9.0 s     44.2 s    9.6 s / 11.0 s
//
// Until issue 21 the fast profile probed every 200 ms with a 100 ms timeout
// and a suspicion of up to three times SuspicionTimeout (measured p50 / p99:
// 1.14 / 1.41 s at N = 5, 1.13 / 1.48 s at N = 20, 1.42 / 1.73 s at N = 50).
// Halving the probe timings and the unconfirmed suspicion holds a frozen
// host's removal under a second at p99 (cmd/gateway's
// TestFrozenInstanceRemovedByGossip: 20 SIGSTOPs, p99 0.77 s). The price:
// twice the probe traffic, and a live node that cannot answer a probe
// within 50 ms, nor refute the suspicion within 300 to 600 ms (a process
// starved of CPU, a GC pause, a congested link), is declared dead and
// removed until it refutes. 50 nodes in one process on two cores shared
// with other work (load average 7) starve that way: BenchmarkDetection's
// N = 50 did not converge there with either profile, each node seeing 33
// to 45 members of 50 with this one, 49 or 50 with the old one; 5 and 20
// nodes, and one node per process (cmd/gateway's tests), declared no live
// node dead in these runs.
//
// For comparison, Eureka's defaults (lease renewal every 30 s, expiry after
// 90 s without renewal, an eviction task every 60 s, then the server's
// response cache, the client's registry fetch and Ribbon's server list, 30 s
// each) take 90 to 270 s to stop routing to a crashed instance: the fast
// profile is some two hundred times quicker, the lan profile ten to thirty.
//
// All nodes of a cluster should use the same profile. ProfileFast assumes
// round trips well under 50 ms and processes that are not starved of CPU
// for hundreds of milliseconds; a false suspicion is refuted, a false death
// is undone by NodeAlive when the node refutes, but both cost churn.
//
// # Security
//
// Meta is a claim, not a proof: any node can say it is any instance. So a
// gateway acts on a death (or a revival) only when the node's name and
// address are the ones the instance's registry record names (the registry
// is the truth, and its write permissions are per service); a claim from
// any other node is ignored and counted. What the record cannot stop is a
// member lying about another member's liveness: without a key, anything
// that reaches a gossip port can join and gossip that a real instance is
// dead; it refutes when it hears of it, but may be dropped for the
// moment in between.
//
// SecretKey encrypts and authenticates every packet and stream with
// AES-GCM, so only holders of the key are members at all; use one, the same
// on every node, wherever the gossip port is reachable beyond loopback
// (Start warns otherwise). Label keeps clusters sharing a network apart.
// Nodes with different keys or labels (or with and without one) never join
// each other.
package gossip
