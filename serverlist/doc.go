// Package serverlist holds the instance registry on JetStream KV and the
// lookups that turn instance IDs into dialable instances.
//
// # Registry
//
// A [Registry] keeps one KV entry per running instance in a bucket
// ([BucketName] of the subject prefix: "pushlb_lb" for the default prefix
// events.DefaultPrefix): the key is [EncodeKey] of service and instance ID, the value
// the JSON of an [Instance]. The bucket's MaxAge is the lease. Two forms of
// lease coexist (lease.go, docs/protocol.md section 4):
//
//   - [Registry.Claim] writes the record to never age out and starts a
//     lease beside it ([LeaseKey]), which the publisher renews
//     ([Registry.RefreshLease]); gateways watch the records only
//     ([RecordKeys]), so no renewal reaches them, and a [Reaper], elected
//     among the gateways, removes the record of a lease that ended;
//   - [Registry.Register] writes a record that carries its own lease: it
//     expires unless put again ([Registry.Refresh]), the way simple
//     clients in other languages do it.
//
// [Registry.Deregister] removes record and lease on a clean stop. The
// bucket has limit markers enabled (nats-server 2.11+), so an expiry reaches
// every watcher as a purge, the same way a deregistration does.
//
// The bucket's configuration belongs to the deployment: [Open] creates the
// bucket when it is missing and otherwise uses it as it is, its TTL being
// the lease in effect (a configured TTL that disagrees is logged as a
// warning). [Registry.Ensure] recreates a lost bucket.
//
// # Identity
//
// One live process holds an instance ID. [Registry.Claim] registers with a
// create-only write; a record of another owner ([Instance].Owner) is
// watched, with its lease, for a renewal (its holder lives: [ErrInUse]),
// after asking the caller whether the holder answers
// (ClaimOptions.HolderAnswers: a live duplicate is refused at once), or
// taken over once it proves dead (no renewal for half the TTL, or the lease
// ended: a gateway's reaper ends it at once for a holder whose crash it
// saw, [Reaper.Release]), or at once with ClaimOptions.Replace. Conditional writes
// ([Registry.Create], [Registry.Update], [Registry.DeregisterRevision],
// [Registry.DeregisterOwned]) let a publisher refresh, re-assert and remove
// only its own record; [Superseded] tells a legitimate replacement (a newer
// incarnation) from an older or forged record.
//
// Key encoding: KV keys allow only [-/_=.a-zA-Z0-9], while instance IDs are
// opaque (Eureka's "host:service:port", anything with '.', '/', spaces,
// Unicode). A key is therefore
//
//	<service>.<base64url(instanceId)>
//
// with the URL-safe alphabet of RFC 4648 §5 and no padding. Service names
// are NATS-token safe and stay readable, so one service's keys match
// "<service>.*".
//
// # Mirror and Lookup
//
// A gateway does not query the registry per event. A [Mirror] keeps a local
// copy of the bucket through a KV watch, resyncs after a NATS reconnect, and
// serves its last known state while NATS is away. Its watch of every record
// reads through a pull consumer that holds at most 2,048 messages
// (kvwatch.go), so that the client does not queue the registry while the
// mirror applies it (the replicator reads another region's records the
// same way); a followed service's watch is KeyValue.Watch's. A
// [Lookup] resolves an instance ID from the mirror (a map read) and, when
// an event has outrun the mirror, from the registry with a few quick
// retries: the event is a hint,
// the registry is the truth, and an ID the registry does not hold after the
// retries resolves to ErrNotFound.
//
// [MirrorStats].Revision is the last bucket revision the mirror applied,
// published after its effect and its OnChange call: a caller that wrote at
// revision r (Register returns it) waits for Revision >= r rather than for
// time to pass. The mirror keeps each instance's revision ([Entry],
// [Mirror.Entries]); a put that leaves a value unchanged (a lease refresh)
// only updates it and calls OnRefresh, so it costs no copy and no rebuild;
// one that re-puts the stored bytes is found by a keyed hash of them,
// without decoding the value or allocating (about 0.2 µs in a mirror of
// 100,000 instances, BenchmarkMirrorRefresh). Its records are compact (a
// cold start loads them all): the strings records repeat (zones, labels,
// NATS server IDs) are kept once, metadata as one map shared by the
// records that carry the same labels, the fields a balancer routes by as
// a balancer server that the balancer keeps instead of a copy
// ([Mirror.Server], [Lookup.ResolveServers], balancer.SetServersShared),
// and values in the shape publishers write are decoded
// without encoding/json; readers still get Instances of their own.
// [Mirror.Versions] gives a reconciliation what it needs (incarnation and
// revision) without copying records.
// Revisions are the server's, so no client can forge their order; the
// subscriber orders membership by them. When the bucket is gone (a server
// restarted without its store, a deleted bucket), the mirror recreates it
// and resyncs, and keeps its revisions growing across the new bucket.
//
// # Lifecycle
//
// [NewMirror] builds a mirror without starting anything; [Mirror.Start]
// starts its goroutine; [Mirror.Close] stops it, waits for it, and is
// idempotent. A Registry and a Lookup own no goroutine and need no Close.
//
// # Dependencies
//
// serverlist depends on events (the wire rules it shares) and nothing higher:
// the conversion of an Instance into a balancer's server lives in lbvisitor,
// so a process that only announces (cmd/announce, publisher) does not link
// the balancer.
//
// Typical gateway wiring:
//
//	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{})
//	mirror := serverlist.NewMirror(reg, serverlist.MirrorConfig{OnChange: onChange})
//	err = mirror.Start(ctx)
//	defer mirror.Close()
//	lookup, err := serverlist.NewLookup(reg, mirror, serverlist.LookupConfig{})
//	instances, err := lookup.ResolveAll(ctx, "orders", ids)
package serverlist
