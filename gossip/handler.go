package gossip

// Member is another node as this one knows it.
type Member struct {
	// Name is the node's unique name (see DefaultNodeName).
	Name string

	// Addr is the node's advertised gossip address, "host:port".
	Addr string

	// Meta is what the node says about itself.
	Meta Meta
}

// Reason says why a node is gone.
type Reason string

const (
	// ReasonDead means the failure detector declared the node dead: it
	// stopped answering probes and did not refute the suspicion in time. A
	// crash, a kill -9, a partition or a process stalled for seconds.
	ReasonDead Reason = "dead"

	// ReasonLeft means the node announced its own departure with Leave.
	ReasonLeft Reason = "left"
)

// Handler is told about other nodes of the cluster; never about the local
// node.
//
// Threading: a Node calls its Handler from one goroutine that it owns, one
// call at a time, in the order memberlist reported the changes. memberlist
// reports them while holding its own locks; the Node only queues them
// (without bound, so a burst never blocks memberlist) and a slow Handler
// delays later calls, never gossip or failure detection. A Handler may call
// the Node's methods, except Close, which waits for the Handler to
// return. After Close returns, no method is called again; events still
// queued then are dropped.
//
// Only nodes whose Meta decodes and validates are reported; others are
// logged and ignored. NodeGone follows a NodeAlive for the same name.
type Handler interface {
	// NodeAlive reports a node that joined, came back after being declared
	// dead (it refuted, or a partition healed), or changed its Meta. It may
	// be called again for a node already alive; the last call wins.
	// Suspicion alone is not reported: a suspect that refutes in time was
	// never gone.
	NodeAlive(m Member)

	// NodeGone reports a node that was declared dead or that left.
	NodeGone(m Member, reason Reason)
}

// HandlerFuncs adapts functions to a Handler. A nil field ignores that
// event.
type HandlerFuncs struct {
	Alive func(m Member)
	Gone  func(m Member, reason Reason)
}

// NodeAlive calls f.Alive if it is set.
func (f HandlerFuncs) NodeAlive(m Member) {
	if f.Alive != nil {
		f.Alive(m)
	}
}

// NodeGone calls f.Gone if it is set.
func (f HandlerFuncs) NodeGone(m Member, reason Reason) {
	if f.Gone != nil {
		f.Gone(m, reason)
	}
}

var _ Handler = HandlerFuncs{}
