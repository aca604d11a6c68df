// Command announce announces a service instance to pushlb's gateways over
// NATS: it registers the instance in the registry (a JetStream KV bucket)
// and publishes an online event once the instance is ready, keeps the
// registry lease alive while it runs, and announces it offline before it
// stops. Gateways then route to the instance at once, and stop routing to it
// at once, instead of polling. The wire protocol is docs/protocol.md.
//
// # Modes
//
// Hold mode announces an address served by another process:
//
//	announce -service orders -addr 127.0.0.1:9001 [-id ID] [-zone Z] [-meta k=v]... [-secure]
//
// It waits until the address accepts TCP connections (or until -health
// answers 2xx), for at most -ready-timeout, then announces and holds the
// lease. On SIGINT or SIGTERM it publishes the offline event, removes the
// registry entry and exits 0.
//
// Supervise mode starts the service itself:
//
//	announce [flags] -- COMMAND [ARGS...]
//
// COMMAND inherits stdin, stdout, stderr and the environment and runs in its
// own process group, so that a Ctrl-C at a terminal reaches announce first.
// announce connects to NATS before it starts COMMAND (a deployment without
// NATS fails fast and leaves nothing behind), announces once the address is
// ready, and exits with COMMAND's exit status, or 128+N if a signal N killed
// it, as shells report. On SIGINT or SIGTERM it withdraws the instance
// (offline event, then registry removal) first, waits -drain so gateways
// stop sending, and only then forwards the signal to COMMAND's process
// group; a second SIGINT or SIGTERM cuts the drain short. SIGHUP, SIGUSR1
// and SIGUSR2 are forwarded at once. If COMMAND exits on its own, announce
// withdraws at once; if it exits before it was ready, nothing is announced.
// If it is not ready within -ready-timeout, announce stops it (SIGTERM, then
// SIGKILL after 5 s) and exits 1. A stop signal before the announcement is
// forwarded at once; one that comes while announce is still connecting,
// before COMMAND starts, ends announce with 128+N. On Linux COMMAND also
// receives SIGTERM if announce itself is killed. A COMMAND that cannot be
// found gives 127, one that cannot be run 126.
//
// In hold mode a stop signal before the announcement ends announce with
// status 0: there is nothing to undo.
//
// # Health
//
// Once announced, announce keeps checking the instance every
// -health-interval (default 5s) with the readiness check: a GET of -health
// answering 2xx, else a TCP connect to -addr. After -health-failures
// (default 3) consecutive failures it announces the instance offline: the
// offline event, with the reason "unhealthy: <error>", then the removal of
// its registry record and lease, so that every gateway stops routing to it
// at once and no resync or lease probe brings it back. announce, its gossip
// node and COMMAND keep running. The first passing check announces it
// online again (record, lease, online event) with the same incarnation: the
// same life of the instance. A process that took the ID over meanwhile
// (-replace, or a restart) keeps it: this announce exits 1 as a replaced
// one does. -health-interval 0 turns the checks after the announcement
// off (announce checks only before announcing). publisher.WatchHealth is
// the same for programs that announce themselves; docs/protocol.md,
// "Down and up", gives the rules.
//
// # One live process per instance ID
//
// announce claims the instance ID in the registry (docs/protocol.md,
// "Identity"). If another live process holds it (it answers at the
// record's gossip or service address, or refreshes its record while
// announce watches it, up to half the bucket's TTL), announce refuses: it
// logs why in one line, publishes and removes nothing, stops COMMAND in
// supervise mode, and exits 1. The address is not probed when it is
// announce's own (a restart on the same -addr, whose command is up): the
// watch alone decides. A record whose holder stopped refreshing (a crash
// whose lease has not run out) is taken over after that wait, which no
// timeout of announce cuts short. -replace takes the
// ID over at once: the replaced announce notices at its next refresh, logs
// an error, exits 1 without withdrawing (stopping its COMMAND in supervise
// mode), and never fights back. While it runs, announce re-asserts its
// record at its next refresh if it finds it removed (deregistered, expired,
// purged, the bucket lost) or overwritten by an older or forged
// registration, and logs a warning.
//
// # Lease
//
// The lease is the registry bucket's TTL, which belongs to the deployment:
// announce never changes the bucket. It creates it when missing (with
// -lease, default 30 s) and otherwise uses its TTL, warning when a given
// -lease disagrees; it refreshes at a third of the TTL. The same holds for
// the bucket's replicas: -registry-replicas (default 0: min(3, the
// cluster's JetStream servers), as the server places them) applies only
// when announce creates the bucket; announce never scales an existing
// bucket up or down (the gateway scales it up).
//
// Offline mode announces an instance offline on its behalf, for example
// after its host died:
//
//	announce offline -service orders -id ID [-reason R] [-incarnation N]
//
// It publishes the offline event and removes the registry entry. Gateways
// ignore an offline event whose incarnation is lower than the one they know,
// so announce uses the incarnation stored in the registry. When the registry
// holds no entry (it expired or was removed), it uses the current time in
// nanoseconds: higher than that of any earlier start, so gateways that still
// route to the ID drop it, and lower than that of any later start, which
// still comes online normally. -incarnation overrides both. Offline mode
// only reads and purges the registry bucket; it never creates it or changes
// its settings.
//
// # Flags
//
// Instance (hold and supervise modes):
//
//	-service NAME        service name, a NATS token: [A-Za-z0-9_-]{1,128} (required)
//	-addr HOST:PORT      address gateways dial (required). An empty, 0.0.0.0 or
//	                     :: host registers os.Hostname() and checks readiness
//	                     on 127.0.0.1
//	-id ID               instance ID; default Eureka's HOST:SERVICE:PORT
//	-zone Z              availability zone
//	-meta k=v            metadata label, repeatable
//	-secure              the instance speaks TLS
//	-health URL          readiness and health check: GET URL until it answers
//	                     2xx, instead of a TCP connect to -addr
//	-health-interval D   once announced, check health every D (default 5s; 0:
//	                     only before announcing)
//	-health-failures N   consecutive failed checks that announce the instance
//	                     offline until a check passes (default 3)
//	-ready-timeout D     how long to wait for readiness (default 30s; 0 waits forever)
//	-drain D             supervise mode: wait between the offline event and
//	                     forwarding the signal (default 1s)
//	-lease D             registry TTL used if announce creates the bucket
//	                     (0, the default: 30s; else at least 1s). An existing
//	                     bucket's TTL wins, with a warning if they differ; the
//	                     entry is refreshed every third of the TTL in effect
//	-registry-replicas N replicas of the registry bucket if announce creates it,
//	                     1 to 5 (0, the default: min(3, JetStream servers))
//	-replace             take the instance ID over even if another live process
//	                     holds it; that process yields and exits 1
//	-gossip HOST:PORT,.. gossip (memberlist) peers to join, usually the gateways'
//	                     -gossip-bind addresses; gossip is on when this or
//	                     -gossip-bind is set, off otherwise
//	-gossip-bind H:P     gossip bind address (default 0.0.0.0:0: a free port, so
//	                     instances share a host; the node's name and address go
//	                     in the registry entry, and gateways accept gossip about
//	                     the instance only from that node)
//	-gossip-profile P    lan (memberlist's LAN timings: a crash is noticed in
//	                     ~6-10 s) or fast (~0.6-0.8 s); all nodes must agree
//	-gossip-key K        base64 AES key (16, 24 or 32 bytes) encrypting and
//	                     authenticating gossip, the same on every node
//	                     (head -c32 /dev/urandom | base64); without it, on a
//	                     non-loopback address, announce warns at start
//	-gossip-key-file F   the key read from a file; PUSHLB_GOSSIP_KEY in the
//	                     environment is read when neither is given
//	-gossip-label L      keeps clusters on one network apart
//
// -gossip-profile, -gossip-key and -gossip-label are checked even with gossip
// off (an invalid value is a usage error), and announce warns that they have
// no effect then.
//
// Offline mode:
//
//	-service NAME        service name (required)
//	-id ID               instance ID (required)
//	-reason R            reason carried by the event (default "manual")
//	-incarnation N       incarnation to announce offline (default: the registry's,
//	                     else the current time in ns)
//
// Common to all modes:
//
//	-nats URL            NATS server URLs, comma-separated (default nats://127.0.0.1:4222)
//	-nats-timeout D      how long to retry the first NATS connection (default 10s)
//	-nats-ping-interval D  ping the NATS server every D (default 5s, or a sixth
//	                     of -lease when shorter); 2 pings unanswered and the
//	                     connection is made again, so that a paused server or
//	                     a dead link is noticed before the lease ends; below
//	                     a quarter of -lease
//	-creds FILE          NATS credentials file
//	-nkey FILE           NKey seed file (plain NKey authentication)
//	-user U, -password P NATS user and password
//	-password-file FILE  the password read from a file
//	-token T             NATS token; -token-file FILE reads it from a file
//	                     Secrets may also come from the environment, off the
//	                     command line: PUSHLB_NATS_PASSWORD (with -user),
//	                     PUSHLB_NATS_TOKEN, PUSHLB_NATS_NKEY_SEED_FILE
//	-tls-ca FILE         CA certificates to verify the NATS server
//	-tls-cert FILE, -tls-key FILE   client certificate and key
//	-prefix P            subject prefix (default "lb"); the registry bucket is
//	                     pushlb_<P with . replaced by _>
//	-log-level L         debug, info, warn or error (default info)
//
// Logs go to stderr: human-readable when stderr is a terminal, JSON lines
// otherwise.
//
// # Exit status
//
//	0    stopped by SIGINT or SIGTERM after withdrawing (hold), or done (offline)
//	1    NATS unreachable after -nats-timeout, the registry unusable, the
//	     address not ready within -ready-timeout, a withdrawal that failed,
//	     the instance ID held by another live process (refused), or this
//	     process replaced by a newer one (-replace)
//	2    usage error: a missing or invalid flag (a bad gossip key or profile too),
//	     unexpected arguments
//	N    supervise mode: COMMAND's status (128+signal if a signal killed it;
//	     126 or 127 if it could not be started)
//
// # Examples
//
//	announce -service orders -addr 10.0.0.5:8080 -zone eu-west-1a -meta version=1.4.2
//	announce -nats nats://nats:4222 -service orders -addr :8080 -health http://127.0.0.1:8080/health -- ./orders -port 8080
//	announce offline -service orders -id 10.0.0.5:orders:8080
package main
