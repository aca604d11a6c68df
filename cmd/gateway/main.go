// Command gateway is pushlb's gateway: an HTTP reverse proxy whose server
// lists are pushed, not polled. Instances announce themselves over NATS
// (see cmd/announce); the gateway rebuilds the affected balancer the moment
// one comes or goes.
//
//	gateway [-config FILE] [-listen ADDR] [-admin ADDR] [-nats URL] [-zone Z]
//	        [-gossip-bind host:port] [-gossip host:port[,..]] [-demo]
//
// Without -nats it starts an embedded NATS server with JetStream on
// -embedded-nats (127.0.0.1:4222), which announce processes can use. It
// routes /<service>/<rest> to <service> with the prefix stripped; the
// config file may add routes, and per-request hints (hints:, or per route):
// a header naming the zone to prefer, and a key (header, cookie, query
// parameter or client address) for the keyed Rendezvous rule. The admin
// listener serves / (the list of its endpoints), /-/lb (JSON, or HTML for
// a browser), /metrics (Prometheus), /healthz (liveness: the process
// serves) and /readyz (routing state loaded; stays ready through a NATS
// outage, which its body shows). The proxy listener has read, idle and
// header timeouts and a connection limit (-http-* flags, http: in YAML).
//
// Crashed instances are removed when their registry lease expires (-lease,
// 30 s) or, with gossip on (-gossip-bind and/or -gossip; instances run
// announce -gossip <gateway's gossip address>), when memberlist declares
// their node dead: about 1 s with -gossip-profile fast, 6-10 s with lan.
//
// -config takes a YAML file (see docs/config.md) or a Ribbon .properties
// file. Flags override the file. A bad configuration exits with status 2.
// SIGINT or SIGTERM stops accepting requests, lets in-flight ones finish
// (bounded by shutdownTimeout), and exits 0.
package main

import (
	"os"

	"github.com/pushlb/pushlb/internal/app/gateway"
)

func main() {
	os.Exit(gateway.Main(os.Args[1:], os.Stdout, os.Stderr))
}
