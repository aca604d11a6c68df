// Package publisher is the service side of pushlb's push path: an instance
// announces itself online and offline.
//
// Announce registers the instance in the registry (JetStream KV) and then
// publishes <prefix>.svc.<service>.online; Withdraw publishes the offline
// event first, so gateways stop routing at once, and then deregisters. The
// record is written once and never ages out by itself; while announced, a
// lease loop renews the instance's lease, a key beside the record, every
// LeaseInterval, so that no gateway receives the renewals and a reaper
// removes the record once the lease ends (serverlist.Reaper). After a NATS
// reconnect (the connection reports
// it; a short random delay lets gateways resubscribe) the instance is announced
// again (register, then online), so a gateway that missed events or saw the
// lease run out during the outage learns of it again.
//
// The reconnect needs the connection to notice that it is gone. A paused
// NATS server or a dead link leaves it open while nothing gets through,
// and only the client's pings reveal it: connect with PingOptions (a ping
// every 5 s, 2 unanswered at most, where nats.go's default pings every 2
// min) so that it is noticed within half the lease. New logs a warning to
// Config.Logger when the connection's PingInterval x MaxPingsOut is not
// below half the registry's lease.
//
// With Config.Gossip set, the instance is also a gossip (memberlist) member
// from its announcement to its withdrawal, its node metadata naming its
// service, instance ID and incarnation: gateways in the same cluster notice
// a crash within the gossip profile's detection time (about a second with
// the fast profile) rather than the lease's.
//
// # Lifecycle
//
// New builds a Publisher without publishing anything or starting a
// goroutine. Announce is its start: it registers, publishes and starts the
// lease loop (and the gossip node). Withdraw is the graceful stop of the
// announcement: offline event, deregistration, gossip leave. Close stops
// the lease loop and the gossip node and waits for them, without
// withdrawing (to the gateways it looks like a crash: the lease expires and
// a reaper removes the record, gossip declares the node dead); it is idempotent and ends the Publisher.
// A service calls Withdraw, then Close.
//
// # Identity
//
// One live process holds an instance ID. Announce claims it
// (serverlist.Registry.Claim): a record of another live process is refused
// with an error wrapping serverlist.ErrInUse, unless Config.Replace; a
// holder that answers at its gossip node or service address (unless that
// address is the announced instance's own) is refused at once, others
// after a watch of the record for a refresh (Publisher.ClaimWait). The
// lease loop renews the lease with a compare-and-set and reads the record
// back every third renewal; a lease or record found removed
// (deregistered, expired, purged, the bucket lost: the bucket is recreated
// when the publisher may) or overwritten by an older or forged registration
// is re-asserted and a warning logged. A record of a newer incarnation
// under another owner means a newer process replaced this one: the
// publisher yields for good, Replaced is closed, and Withdraw returns
// ErrReplaced without touching the registry or the events. Withdraw only
// ever removes this publisher's own record.
//
// # Health
//
// A live process whose instance cannot serve takes itself out of the lists
// and back in, as Eureka's DOWN status or a failing Consul check: MarkDown
// publishes the offline event (reason "unhealthy...") and removes the
// record and its lease, so that every gateway drops the instance at once
// and no resync or lease probe brings it back; MarkUp writes the record
// again and publishes the online event, with the same incarnation (the
// same life). WatchHealth runs a caller's check on an interval and calls
// them: down after HealthConfig.Failures consecutive failures, up after a
// pass (cmd/announce's -health-interval and -health-failures). While down
// the process stays a gossip member and keeps its owner token; a newer
// process that took the ID over meanwhile keeps it (MarkUp yields).
//
// The incarnation orders events about one instance ID: it grows with every
// start of the instance. Announce uses the instance's Incarnation when set,
// else the current time in nanoseconds. Re-announcements (lease, reconnect)
// keep the incarnation: they are the same life of the instance.
package publisher
