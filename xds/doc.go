// Package pushlbxds is an xDS control plane fed by pushlb's push path: it
// serves the services a pushlb.Client knows over ADS (the aggregated
// discovery service, state of the world and delta), so that grpc-go's
// proxyless xDS client ("xds:///orders") and Envoy learn of each instance
// that comes or goes the moment the client does, without polling.
//
// It is a module of its own (github.com/pushlb/pushlb/xds), so that the
// main module does not depend on go-control-plane or grpc-go. It builds on
// the public embedding API: a started *pushlb.Client, its WatchServices
// (the set of services) and its Watch (each service's list).
//
//	c, _ := pushlb.New(nc, pushlb.Config{Follow: pushlb.FollowAll}) // the server serves every service
//	c.Start(ctx)
//	srv, _ := pushlbxds.NewServer(c, pushlbxds.WithLogger(log))
//	ln, _ := net.Listen("tcp", "127.0.0.1:18000")
//	go srv.Serve(ln)
//	defer srv.Stop()
//
// Over a client that follows on request (pushlb.FollowRequested), the
// server serves on demand: the services the streams subscribe to, each
// followed when a stream first names it (see Stats.Follows; docs/xds.md,
// "Which services").
//
// The gateway serves it behind a flag in the build of
// github.com/pushlb/pushlb/xds/cmd/gateway ("gateway -xds 127.0.0.1:18000",
// see Extension). docs/xds.md has the bootstrap of grpc-go and an Envoy
// configuration.
//
// # Resources
//
// Each service S has four resources, all named S:
//
//   - a Listener with an API listener (what grpc-go reads for "xds:///S"):
//     an HTTP connection manager with the router filter, its routes from
//     the RouteConfiguration S over ADS;
//   - a RouteConfiguration: every path of every authority to the Cluster S;
//   - a Cluster of type EDS (its endpoints from the ClusterLoadAssignment S
//     over ADS), ROUND_ROBIN; WithHTTP2Upstreams marks it HTTP/2 for Envoy;
//   - a ClusterLoadAssignment: one locality per zone, each instance an
//     endpoint (host:port) with health HEALTHY, its weight (the record's
//     when set, else its metadata's WeightKey, "weight"; see endpoints),
//     and its instance ID in the
//     endpoint's metadata (MetadataKey). A locality's weight is the sum of
//     its endpoints' weights (1 each without one).
//
// Every resource is validated (its Validate, and that of each message it
// carries in an Any) before it is installed; one that fails is logged,
// counted (Stats.InvalidResources) and not installed, so the previous
// version stays. An instance that would make grpc-go reject the whole
// ClusterLoadAssignment (an address another instance of the service has)
// is left out, logged and counted (Stats.DroppedInstances).
//
// # Zones and priorities
//
// The zone of an xDS client is the zone of its node's locality (grpc-go's
// bootstrap "node": {"locality": {"zone": "a"}}; Envoy's
// --service-zone or node.locality.zone). A client in zone Z, when Z is one
// of the service's zones (without regard to case), gets Z's locality at
// priority 0 and the others at priority 1: it sends to its own zone, and
// fails over to the other zones when Z has no instance left (the list says
// so at once) or none it can reach (grpc-go's priority policy moves on as
// soon as priority 0 is in TRANSIENT_FAILURE). A client without a zone, or
// of a zone the service does not have, gets every locality at priority 0:
// grpc-go splits the load between the zones by locality weight. pushlb's
// own rules (ZoneAvoidance, the breaker) stay in pushlb's balancers; an xDS
// client balances with its own policies.
//
// # The cache
//
// The resources live in go-control-plane LinearCaches, one per type, and
// for ClusterLoadAssignments one per client zone (at most
// WithMaxClientZones of them, made when a client of a new zone first asks),
// behind one cache.Cache that picks by type and by the zone of the
// request's node. A LinearCache versions each resource on its own: a list
// change replaces one ClusterLoadAssignment per client zone and wakes only
// the streams that watch that service, and a new or removed service adds or
// removes one resource of each type. A snapshot cache would rebuild and
// resend every resource of every service for each change, and hold one
// snapshot per node group.
//
// # The path of a change
//
// A service's list reaches the server through Watch, on the goroutine of
// the client's push path, which only converts the list and hands it to the
// server's feed goroutine (no wait for xDS on the push path). The feed
// installs the newest pending list of each service in the caches, which
// answer the waiting streams at once: a change is a new resource version
// within microseconds of the client applying it, and a burst of changes
// becomes its latest list. A new service's ClusterLoadAssignment is
// installed before its Cluster, RouteConfiguration and Listener, and a
// removed service's are removed in the other order, so that no resource
// names one that is missing.
//
// # Failure behaviour
//
// The server serves the client's lists: while NATS is unreachable the
// client keeps its last lists, and so do the resources. A service with no
// instance keeps its resources with an empty ClusterLoadAssignment (grpc-go
// fails RPCs with UNAVAILABLE) until the client removes it
// (pushlb.Config.ServiceGrace); its resources are then removed (grpc-go
// then reports the listener as not found). When the server stops or
// restarts, clients keep the resources they have and reconnect; a
// restarted server has a new version prefix, so a client that reconnects
// gets every resource again.
//
// # Threading
//
// NewServer starts nothing. Serve starts, on its first call, one feed
// goroutine that follows the client; the gRPC server runs its own. Serve,
// Stop and Stats may be called from any goroutine; Stop ends the feed, the
// streams and every Serve, and waits for them.
package pushlbxds
