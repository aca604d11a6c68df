// Command haproxy-sync keeps HAProxy backends equal to pushlb's server
// lists through HAProxy's Runtime API, without reloads: it follows the
// services it is given over NATS (as a gateway does: announcements,
// crash advisories, gossip, leases) and turns each change of a service's
// list into "add server", "set server", "del server" commands on the
// service's backend. docs/haproxy.md has the haproxy.cfg it needs and the
// measured times.
//
//	haproxy-sync -socket /run/haproxy/admin.sock [-zone a] [-check] orders payments=be_payments
//
// The NATS and gossip flags are the gateway's: with -gossip-bind it joins
// the gateways' gossip, so that a crashed host's instances leave within
// gossip's detection time. -config FILE reads the same settings from YAML
// (the flags' names in camelCase, "nats:" and "gossip:" with the gateway's
// keys, and "backends:" of service and backend); a flag given wins over the
// file, and the file's backends add to the arguments'.
//
// Each argument is SERVICE[=BACKEND]: the backend (the service's name by
// default) gets one server per listed instance, named -name-prefix (default
// "pushlb-") followed by the instance ID (characters HAProxy refuses in a
// name become '_', and a hash of the ID then follows). Servers without the
// prefix, those of haproxy.cfg, are never touched.
//
// # What a change does
//
//   - An instance joins: "add server BACKEND/NAME IP:PORT weight W [backup]
//     [check]", then "enable health" (with -check) and "enable server".
//   - An instance leaves gracefully (announced offline): "set server ...
//     state drain" (no new request; requests in flight finish), until it has
//     no session and no connection in use, at most -drain-timeout (10 s);
//     then "state maint", "shutdown sessions server" only if the drain timed
//     out, and "del server".
//   - An instance crashes (the NATS server's disconnect advisory, gossip, or
//     its lease's end): "state maint", "shutdown sessions server" and "del
//     server" at once.
//   - HAProxy 2.6 deletes only a server in maintenance without connections:
//     a deletion it refuses for that reason is tried again until it succeeds.
//   - A listed server whose address or weight changed (its record rewritten
//     under the same instance ID) is updated in place ("set server ...
//     addr", "weight") as soon as the client's list changes. One found in
//     maintenance or drain is made ready. One whose zone moved it between active and backup
//     leaves and is added again (HAProxy cannot change that at runtime).
//
// TLS: a secure instance (announced with TLS) is added with "ssl" and
// -tls-options ("verify required ca-file @system-ca" by default); a CA file
// of your own must be loaded by haproxy.cfg first (docs/haproxy.md).
//
// Weights: pushlb's 1 to 1,000 (default 100) become HAProxy's 1 to 256 as
// w×256/1000 rounded, at least 1 (100 → 26, 1,000 → 256; 1 to 5 → 1).
// Zones: with -zone, an instance of another zone (compared without regard to
// case) is added as a backup server, used only when no active server is up;
// an instance without a zone is active. Give the backend "option allbackups"
// so that the backups share the load when they take over.
//
// HAProxy 2.6's limits: "add server" takes IP addresses only, so an instance
// announced with a host name is resolved first (with -resolve=false it is
// left out with an ErrHostName error); and only a backend with a dynamic
// algorithm takes servers at runtime (roundrobin, leastconn, random, first,
// or a hash with "hash-type consistent"): a static-rr backend is refused at
// start, another that HAProxy refuses is refused at the first "add server";
// both are logged and counted, and retried, while the other backends sync.
//
// # Restarts and reloads
//
// Every -poll (500 ms) haproxy-sync reads the process ID behind the socket
// ("show info"). A new one (a restart, or a reload of a master-worker
// HAProxy: give its master CLI with -master, or a stats socket the new
// worker binds again), or a socket that answers again after a failure,
// makes every backend be read ("show servers state", "show stat") and
// reconciled: HAProxy's backend converges to pushlb's list, never the other
// way. A server of the prefix that pushlb does not list (left by an earlier
// run) is removed. Every -resync (30 s) the backends are reconciled
// regardless.
//
// # Errors
//
// A failed command (the socket refuses, HAProxy refuses: ErrSocket,
// ErrUnknownBackend, ErrStaticAlgorithm, ErrNameClash, ErrRefused,
// ErrReply) is logged with its backend and kind, counted in
// pushlb_haproxy_sync_errors_total{backend,kind} (-metrics ADDR serves
// them), and retried with backoff (50 ms doubling to 5 s) after the backend
// is read again. A backend's failure never stops another backend's sync. A
// socket that cannot be reached at start is an error (exit 1).
//
// # Threading
//
// One goroutine per backend talks to HAProxy, one step at a time; it alone
// owns its view of the backend. pushlb's callbacks (the list watch, the
// list observer that marks crashes) only record the new list under a mutex
// and wake that goroutine. One more goroutine watches HAProxy's process ID.
// Every command opens a connection of its own: nothing half-read survives a
// restart.
package main
