// Package pushlb wires pushlb's push path into a Go program in a few lines:
// the balancers of every service a NATS registry holds, kept current by
// announcements instead of polling, behind an http.RoundTripper and a
// reverse-proxy http.Handler.
//
//	nc, _ := nats.Connect(url, pushlb.PingOptions()...) // the caller owns the connection
//	c, err := pushlb.New(nc, pushlb.Config{})           // the defaults; validates, starts nothing
//	err = c.Start(ctx)                                  // registry state loaded, events followed
//	defer c.Close()
//	client := &http.Client{Transport: c.Transport()}
//	resp, err := client.Get("http://orders/api/x") // one live instance of "orders"
//
// A gateway serves c.Handler(): "/orders/api/x" goes to "/api/x" on an
// instance of orders (routes may be added with WithProxyOptions).
//
// PingOptions makes the connection ping its server every 5 s (nats.go's
// default is 2 min), so that a paused NATS server or a dead link is noticed
// and the client reconnects and resyncs within the registry's lease; Start
// logs a warning when the connection's pings are too slow for the lease.
//
// # What it wires
//
// Start opens (or creates) the registry bucket on JetStream KV, subscribes
// to the change subjects (<prefix>.svc.>), loads the registry's state, and
// from then on rebuilds a service's balancer from instance-ID lookups each
// time its live set changes: an instance that announces itself offline,
// whose process dies (the NATS server's client-disconnect advisory,
// confirmed by a probe: Config.Advisories), whose lease expires, or that
// gossip declares dead (Config.Gossip) stops receiving requests at once. See the subscriber, serverlist, lbvisitor, balancer and
// lbhttp packages for each step, and docs/embedding.md for a walk-through.
//
// This package holds the API and its one wiring, nothing of the pipeline:
// a list goes from the subscriber (subscriber.Subscriber, with its
// delivery guards, subscriber.EmptyGuard among them) to the table of
// services (lbvisitor.Services, where a service is followed and
// unfollowed) and its visitors, which build the balancers' lists.
//
// Every list change is told once, with its causes, to the ListObserver of
// WithListObserver; Watch follows one service's list, the piece adapters
// build on (the gRPC resolver of the module github.com/pushlb/pushlb/grpc),
// and WatchServices the set of services (the xDS control plane of
// github.com/pushlb/pushlb/xds serves every service).
// Balancer lends a read-only view of a service's balancer, and Stats the
// client's counters in this package's own types.
//
// # Lifecycle
//
// New validates the Config and every option together and builds the client without
// touching the network or starting a goroutine. Start connects the pieces
// and returns once the registry's state is in the balancers; ctx bounds the
// start only. Close stops everything Start started and waits for it; it does
// not close the NATS connection, which belongs to the caller. Start may be
// called once; a failed Start leaves the client closed. Close is idempotent
// and may be called without Start.
//
// # Threading
//
// Every method is safe for concurrent use. Transport and Handler may be
// used before Start (services are unknown until then) and after Close (the
// last lists stay in the balancers). List changes of one service are applied
// by one goroutine at a time; picks run concurrently with them and never
// take a lock.
//
// # Errors
//
// New's errors wrap ErrInvalidOption and name every bad field and option.
// Start's errors wrap ErrStarted, ErrClosed, or the failing step's own error
// with the step named: serverlist.ErrNoJetStream (the server runs without
// JetStream), serverlist.ErrLeaseMismatch (Config.Lease disagrees with the
// bucket's), a refused subscription, ctx's error.
// Requests through the Transport fail with *lbhttp.Error values matching
// lbhttp.ErrUnknownService, lbhttp.ErrNoServers or lbhttp.ErrAllTriesFailed.
package pushlb
