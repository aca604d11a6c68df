// Package pushlbk8s bridges Kubernetes EndpointSlices into pushlb's
// registry, so that pods that run no announce are pushed to gateways as
// announced instances are (docs/kubernetes.md).
//
// A [Bridge] watches, through informers (no polling), the Services chosen by
// a label selector in chosen namespaces, their EndpointSlices and, when pod
// labels are copied into the records, their Pods' metadata (a
// metadata-only informer: no pod specs in memory). It keeps the registry
// equal to them:
//
//   - an endpoint that is ready is announced: its record is written and the
//     online event published;
//   - an endpoint that is serving and terminating drains: the offline event
//     is published (gateways stop sending new requests) and its record is
//     kept, marked down (serverlist.StatusDown), until the endpoint goes;
//   - an endpoint that is gone, or neither ready nor serving, is withdrawn:
//     offline event, then the record is removed.
//
// # Records
//
// One record per pod and Service port: its instance ID is
// "<namespace>/<pod>:<port name>" (see [InstanceID]), host the endpoint's
// first address, port the EndpointSlice's port (the pod's port the Service
// targets), zone the endpoint's zone, metadata the chosen pod labels plus
// [MetaService] (the Service, "<namespace>/<name>"). Records carry their
// own lease (serverlist.Registry.Register's form: the bucket's TTL), which
// the leader renews every third of it, so one endpoint change costs one
// registry write. Their Owner is the bridge's owner token (Config.Owner):
// the bridge writes only with create-only and compare-and-set writes, and
// never overwrites or removes a record of another owner (announce's): such
// a record is counted (Stats.Foreign) and left alone.
//
// Writes are batched per Service: every change of a Service or of one of
// its slices queues the Service once (client-go's workqueue), and its
// reconciliation computes the records all its slices call for (so an
// endpoint that moves from one slice to another, as in a split or a merge,
// is not withdrawn in between) and issues the writes it needs at once, in
// parallel.
//
// # Leadership
//
// Replicas elect a leader with a coordination.k8s.io Lease (client-go's
// leaderelection). Every replica keeps its informers warm; only the leader
// writes. A leader that stops or loses the Lease withdraws nothing: its
// records live on their lease, and the new leader reads them back,
// re-asserts those still called for and removes the others.
//
// # Malformed objects
//
// A slice without ports, of an unknown address type, with a port without a
// number, an endpoint without an address, a Service whose pushlb service
// name is invalid or whose port is ambiguous: each is logged (zerolog) and
// counted (Stats.Malformed, the pushlb_k8s_malformed_total counter) and
// skipped. Nothing in an object the API server serves makes the bridge
// panic.
//
// # Lifecycle
//
// [New] builds a Bridge without starting anything; [Bridge.Run] runs it
// until its context ends and returns once every goroutine it started has
// stopped.
package pushlbk8s
