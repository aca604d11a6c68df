// Package dns answers DNS queries from pushlb's pushed lists: an
// authoritative responder for everything that can only discover its
// backends through DNS (nginx's resolver, HAProxy's resolvers with
// server-template, JVM and Python clients, curl, database drivers).
//
// Names, under Config.Domain (default "pushlb."):
//
//	<service>.service.pushlb.              A, AAAA, SRV: the service's reachable instances
//	<service>.<zone>.service.pushlb.       the same, the instances of <zone> first
//	_<service>._tcp.service.pushlb.        SRV (RFC 2782)
//	_<service>._tcp.<zone>.service.pushlb. SRV, the instances of <zone> first
//	<hex address>[-<port>].addr.pushlb.    A or AAAA: the targets of SRV records
//
// A and AAAA answer the reachable instances (alive, breaker closed, not
// ejected; when none is reachable, the alive ones, as a balancer in panic
// does) whose host is an address of that family, rotated from one answer
// to the next; with regions (pushlb.Config.Region), those of the nearest
// region that has a reachable one, as picks go. With a zone (a zone label in the name, else Config.Zone)
// they answer the zone's instances while it has a reachable one, and every
// instance otherwise. An instance whose host is a name is left out of A
// and AAAA (a CNAME may not stand beside other records of its name) and is
// the target of its SRV record by that name.
//
// SRV records carry each instance's port, its weight (1 to 1,000) as the
// SRV weight, and priority 1 for the instances of the zone (the asker's
// zone label, else Config.Zone; every instance when there is no zone) and
// 2 for the others. A target that is an address is named after it and
// the port, one name per instance ("7f000001-9001.addr.pushlb." for
// 127.0.0.1:9001: HAProxy keys the servers of a server-template by target,
// and would take two instances on one address for one), and its A or AAAA
// record rides in the additional section.
//
// Answers carry Config.TTL (default 0: nothing caches an answer, so the
// next query sees the next change). A service no one announced is
// NXDOMAIN; a service with no instance left is an empty NOERROR; a name
// outside the domain is REFUSED. Service names are matched in lower case
// (DNS names are case-insensitive, and resolvers may randomize the case of
// a query): a service whose name has capitals cannot be asked for by DNS.
//
// # Following on demand
//
// A query is interest, as a request is: with a Source over a client that
// follows on request (ClientSource, pushlb.FollowRequested), a query for a
// service not followed yet follows it, within Config.FollowWait, and is
// answered from its first list; a name the registry does not hold costs
// one registry read and is then answered NXDOMAIN from the client's memory
// of it (2 s) without another.
//
// # Bounds
//
// UDP queries are read only while fewer than Config.MaxConcurrent are being
// answered: beyond, they wait in the socket's buffer, and the kernel drops
// what does not fit, as an overloaded name server does. TCP connections
// are accepted while fewer than Config.MaxTCPConns are open. No state is
// kept per name asked: a flood of random names costs what the client's
// own bounds on following cost (at most 64 follows at once, 10,000 names
// remembered absent), nothing more.
//
// # Lifecycle and threading
//
// New validates and builds a Server without binding anything; Start binds
// UDP and TCP on Config.Addr (the same port for both) and serves; Close
// stops both and waits for the answers under way. Close is idempotent.
// Every method is safe for concurrent use. Queries are answered
// concurrently, each on a goroutine of its own; a Source must be safe for
// concurrent use and must not block beyond the context it is given.
package dns
