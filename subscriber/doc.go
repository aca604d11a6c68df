// Package subscriber is the gateway side of pushlb's push path. It
// subscribes to the change topics (<prefix>.svc.> or chosen services), keeps
// a membership table (service -> live instance IDs with their
// incarnations), and hands every change of a service's live set to a
// Handler as an events.ListChanged carrying the full list.
//
// # Ordering
//
// The registry's revisions, which the NATS server assigns and nobody can
// forge, decide what is current: the table keeps per instance the revision
// of the registry entry it saw last, and the mirror's revision when an
// offline was recorded. A registry write observed after an offline (a lease
// refresh, a re-registration) brings the instance back whatever incarnation
// the offline claimed, so a forged offline lasts at most one refresh
// interval and a restarted instance is always routed. A refresh with an
// unchanged value costs a map lookup (the mirror's OnRefresh), not a
// rebuild. Stats.RegistryRevivals counts the instances brought back so.
//
// Incarnations order events within the life the registry last showed: an
// event with a lower incarnation than the one known is stale and dropped;
// within one incarnation an instance goes online once and offline once, so
// a late online after the offline is stale too. An incarnation more than
// events.MaxIncarnationAhead (1 h) ahead of the clock is dropped as
// DropFuture ("future"), from events and gossip alike. Offline members are
// remembered (tombstones) for TombstoneTTL so late events of an old
// incarnation cannot resurrect them. Duplicates are harmless.
//
// # The registry is the truth
//
// Start subscribes first, then loads the registry's current state through
// the serverlist Mirror, then applies the events that arrived meanwhile: no
// gap. Whenever the mirror re-synchronises (after a NATS reconnect) and every
// AntiEntropy interval, the table is reconciled with the registry again:
// registered instances are added, and live instances the registry no longer
// holds (confirmed with a direct read, since the mirror may lag an event) go
// offline. A registry entry that expires (its lease ran out) or is deleted
// is an offline for that instance.
//
// # Regions
//
// NATS forwards events between the clusters of regions (leaf nodes,
// gateways), and instance IDs are unique within a region only. A subscriber
// with a region (Config.Region) drops an event that names another region
// (events.Event.Region) before it touches any state, counted as
// DropOtherRegion ("other_region") and logged at debug only; an event that
// names none is taken as of its own region, the reading of announcers that
// predate regions. Another region's instances reach it through the registry
// alone. A subscriber without a region takes every event.
//
// # Crash detection by advisories
//
// With Config.AdvisorySubject, the subscriber follows the NATS server's
// client-disconnect advisories, which a deployment imports to that subject
// (docs/protocol.md, section 7). An advisory that names the connection a
// record names (serverlist.Instance.NATSServerID, NATSClientID; the
// mirror's ByConnection) starts a probe of the instance in a goroutine the
// subscriber owns: a TCP connect to its gossip node, or else to its
// address. Refused or unreachable, the instance is taken offline at once
// (events.CauseAdvisory) for that record's revision, so that any later
// write of the record brings it back; answered (and answered again over
// 200 ms), it is kept. An advisory that names no record is kept for 5 s,
// for a record naming its connection that reaches the mirror after it (a
// process that died just after announcing). An advisory never removes
// anything by itself, so a forged one costs a probe. Start checks that
// advisories arrive (it opens a second connection, closes it and waits for
// its advisory) and logs once when they do not: crashes are then left to
// gossip and leases. With a Releaser (UseReleaser: the client's reaper),
// a probe that found an instance dead also frees its instance ID while
// that reaper leads, so that a restart claims it at once; the leader also
// probes announcers it does not follow, found by their connection's name
// (release.go).
// Stats.Advisories counts it all.
//
// # Delivery
//
// Changes are coalesced per service: the first change after a quiet period
// is delivered at once, later ones at most once per Coalesce window, and
// changes made while the handler runs are delivered together after it
// returns. A rolling restart of 100 instances is thus a handful of calls, not
// 200. Each service is delivered on its own goroutine, never under a lock,
// so a slow or failing handler for one service never delays another; calls
// for one service never overlap and carry growing revisions.
//
// # Lifecycle
//
// New builds a Subscriber (and its registry mirror) without subscribing or
// starting a goroutine; Start subscribes, loads the registry and starts the
// deliveries; Close unsubscribes, closes the mirror and waits for every
// goroutine and Handler call, and is idempotent.
//
// # Bad input
//
// Malformed, oversized or invalid events, subjects of the wrong shape,
// stale events and duplicates are dropped, counted by reason
// (Stats.Dropped, indexed by a DropReason; AllDropReasons lists them for
// metrics), and logged with zerolog at a bounded rate. The subscriber never
// panics on input and never blocks the NATS delivery goroutine on a
// handler.
//
// # Counters as proof
//
// Stats.Received counts a message once it has been handled (applied or
// dropped), and Stats.Delivered a Handler call once it has returned, so a
// caller, or a test, waits for a counter to reach a value instead of for
// time to pass.
package subscriber
