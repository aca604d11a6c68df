package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// synopsis is printed with every usage error.
const synopsis = `usage:
  announce -service NAME -addr HOST:PORT [flags]                         hold mode
  announce -service NAME -addr HOST:PORT [flags] -- COMMAND [ARGS...]    supervise mode
  announce offline -service NAME -id ID [flags]                          offline mode
Run 'announce -h' for every flag and examples.
`

// helpText describes the modes; the flags follow it.
const helpText = `announce tells pushlb's gateways over NATS when a service instance comes
online and when it goes offline, and keeps its registry lease alive between.

usage:
  announce -service NAME -addr HOST:PORT [flags]
  announce -service NAME -addr HOST:PORT [flags] -- COMMAND [ARGS...]
  announce offline -service NAME -id ID [flags]

Hold mode (no command): wait until HOST:PORT accepts TCP connections (or
-health answers 2xx), announce the instance (registry entry, then online
event), refresh its lease, and on SIGINT/SIGTERM announce it offline and
remove the entry; exit 0.

Supervise mode (a command after --): start COMMAND with this process's
stdin, stdout and stderr, in its own process group, and announce once it is
ready. On SIGINT/SIGTERM: announce offline first, wait -drain so gateways
stop sending, then forward the signal to COMMAND (a second signal cuts the
drain short). SIGHUP, SIGUSR1 and SIGUSR2 are forwarded at once. If COMMAND
exits on its own, announce offline at once. announce exits with COMMAND's
status (128+N if signal N killed it, 127 if it was not found, 126 if it could
not run). If COMMAND is not ready within -ready-timeout it is stopped and
announce exits 1.

Health (hold and supervise modes): once announced, the instance is checked
every -health-interval (default 5s) with the readiness check (-health, else
a TCP connect to -addr). After -health-failures (default 3) failures in a
row, announce announces it offline (offline event with the reason
"unhealthy: ...", registry entry removed, so every gateway stops routing to
it and no resync brings it back) while announce and COMMAND keep running;
the first passing check announces it online again, with the same
incarnation. -health-interval 0 checks only before the announcement.

Offline mode: publish the offline event of an instance and remove its
registry entry, on its behalf. The event carries the incarnation stored in
the registry, since gateways ignore an offline event older than what they
know; without an entry, the current time in ns (or -incarnation).

One live process per instance ID: if another live process holds the ID,
announce refuses it and exits 1 (supervise mode stops COMMAND); -replace
takes it over, and the replaced announce exits 1 without withdrawing. A
record found removed or overwritten while running is re-asserted.
The lease is the registry bucket's TTL: -lease only applies when announce
creates the bucket; a different existing TTL wins, with a warning. So do
the bucket's replicas (-registry-replicas; by default min(3, JetStream
servers)): announce never changes an existing bucket, a gateway scales it up.
-nats takes several URLs, comma-separated: announce fails over between them.
announce pings its NATS server every -nats-ping-interval (default 5s, or a
sixth of -lease when shorter) and reconnects after 2 pings unanswered, so
that a paused server or a dead link is noticed (10-15s by default) before
the lease ends: an interval given must be below a quarter of -lease, and
without -lease a warning says when it is not below a quarter of the bucket's.

The default instance ID is Eureka's HOST:SERVICE:PORT. An -addr host that is
empty, 0.0.0.0 or :: registers this machine's host name and is checked on
127.0.0.1. The incarnation is the start time of announce in ns.

-weight sets the instance's share of its service's traffic relative to the
other instances (default 100: two instances of weights 100 and 300 get 1 and
3 requests in 4). To change the weight of a live instance, start announce
again with the new -weight and -replace: it takes the record over and
updates it, the gateways apply the update as any other, and the process
replaced exits 1 (in supervise mode, restart announce with the new weight).

Exit status: 0 done; 1 NATS unreachable after -nats-timeout, registry
unusable, not ready within -ready-timeout, a failed withdrawal, the ID held by
another live process, or replaced by a newer one; 2 usage error; in
supervise mode, COMMAND's status.

Examples:
  announce -service orders -addr 10.0.0.5:8080 -zone eu-west-1a -meta version=1.4.2
  announce -service orders -addr 10.0.0.6:8080 -weight 300
  announce -nats nats://nats:4222 -service orders -addr :8080 \
      -health http://127.0.0.1:8080/health -- ./orders -port 8080
  announce offline -service orders -id 10.0.0.5:orders:8080
`

// printHelp prints the help of mode m with its flags, grouped.
func printHelp(w io.Writer, m mode, fs *flag.FlagSet) {
	fmt.Fprint(w, helpText)
	if m == modeOffline {
		fmt.Fprintln(w, "\nOffline mode flags:")
		printFlags(w, fs, offlineFlags)
	} else {
		fmt.Fprintln(w, "\nInstance flags (hold and supervise modes; 'announce offline -h' for offline mode):")
		printFlags(w, fs, instanceFlags)
	}
	fmt.Fprintln(w, "\nConnection and common flags:")
	printFlags(w, fs, commonFlags)
}

// printFlags prints the named flags of fs in the format of
// flag.PrintDefaults.
func printFlags(w io.Writer, fs *flag.FlagSet, names []string) {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		kind, usage := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if kind != "" {
			line += " " + kind
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			line += " (default " + f.DefValue + ")"
		}
		fmt.Fprintln(w, line)
	}
}
