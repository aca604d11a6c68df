// Package events owns pushlb's wire protocol on NATS and the one internal
// message that leaves the membership table.
//
// # Wire protocol
//
// An instance announces itself by publishing a small JSON [Event] on
//
//	<prefix>.svc.<service>.online
//	<prefix>.svc.<service>.offline
//
// with [DefaultPrefix] "lb". [Subject], [ServiceSubject], [WildcardSubject]
// and [ParseSubject] build and read those subjects; [Encode], [Decode],
// [DecodeMessage] and [Event.Validate] turn events into payloads and back,
// enforcing every rule of the contract: [MaxPayloadSize], service names that
// are single NATS tokens ([ValidateService]), opaque instance IDs
// ([ValidateInstanceID]), a positive incarnation, an RFC 3339 time, the
// optional region of the instance ([ValidateRegion]) and the version field
// "v". The contract, written for clients in any language, is
// docs/protocol.md at the root of the repository; this package is its
// reference implementation.
//
// Decoding is strict about what it needs and lenient about the rest: unknown
// fields are ignored so the format can grow, while a missing or invalid
// required field, a wrong JSON type, an unsupported version or an oversized
// payload rejects the event with an error that wraps one of the sentinels in
// errors.go and names the field. Callers log, count and drop such events.
//
// An event is a hint: a gateway trusts the registry (a JetStream KV bucket),
// not the event, for an instance's address. Per instance, events are ordered
// by [Event.Incarnation] within the life the registry holds, and the
// registry's own revisions order lives; ordering and the registry belong to
// the subscriber and serverlist packages. [CheckIncarnation] rejects an
// incarnation more than [MaxIncarnationAhead] ahead of the receiver's clock.
//
// # ListChanged
//
// [ListChanged] is the internal message the subscriber's membership table
// hands to balancer visitors: the full list of live instance IDs of one
// service, never a delta.
//
// events is the lowest package of pushlb and the one home of the protocol's
// facts: [DefaultPrefix], [MaxServiceLength], [MaxInstanceIDLength] and
// [MaxPayloadSize] are defined here once, and the registry, publisher and
// subscriber refer to them rather than restating them.
//
// Everything in this package is a pure function of its arguments and safe
// for concurrent use.
package events
