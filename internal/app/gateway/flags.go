package gateway

import (
	"flag"
	"fmt"
	"strings"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/serverlist"
)

// RegisterFlags registers the gateway's command-line flags on fs, each
// bound to its field of c with c's current value as the default. A binary
// loads its file into c first, then parses the command line over it: flags
// given override the file, the others keep its values. The NATS flags are
// natsconn's and the gossip flags gossipflag's, shared with announce.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "proxy `address`")
	fs.StringVar(&c.Admin, "admin", c.Admin, `admin `+"`address`"+` for /-/lb, /metrics, /healthz, /readyz ("off" to disable)`)
	fs.BoolVar(&c.Pprof, "pprof", c.Pprof, "serve Go profiles (net/http/pprof) under /debug/pprof/ on the admin address")
	c.HTTP.RegisterFlags(fs)
	c.NATS.RegisterFlags(fs)
	fs.Lookup("nats").Usage = "NATS server `URL`s (nats://, tls://, ws:// or wss://), comma-separated; empty starts an embedded server with JetStream"
	fs.StringVar(&c.EmbeddedNATS, "embedded-nats", c.EmbeddedNATS, "`address` of the embedded NATS server")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "JetStream data `directory` of the embedded server (default: a temporary directory)")
	fs.StringVar(&c.DataSync, "data-sync", c.DataSync, "JetStream sync `policy` of the embedded server, when it forces writes to disk: always (each write, before acknowledging it) or a duration (at most that long after a write, at least 1s); default 2m (docs/reliability.md)")
	fs.StringVar(&c.Zone, "zone", c.Zone, "the gateway's `zone`, for zone affinity and preference")
	fs.StringVar(&c.Region, "region", c.Region, "the gateway's `region`: requests go to the nearest region with a reachable instance, this one first, then regionPriority's (empty: regions ignored)")
	fs.Func("remote-region", "another region whose records this region's registry copies (remoteRegions; repeat for each): `name[=domain][/bucket]`; the domain defaults to the name, a bucket alone reads it through this server's JetStream (docs/multiregion.md)", func(v string) error {
		rem, err := parseRemoteRegion(v)
		if err == nil {
			c.RemoteRegions = append(c.RemoteRegions, rem)
		}
		return err
	})
	fs.StringVar(&c.Prefix, "prefix", c.Prefix, "NATS subject `prefix`")
	fs.DurationVar(&c.Lease, "lease", c.Lease, "registry lease (the bucket's TTL): 0 takes the bucket's, or 30s when this gateway creates it; a lease given here must match an existing bucket's")
	fs.StringVar(&c.Report.ID, "report-id", c.Report.ID, "publish what this gateway applied of each service on <prefix>.report.`ID`, for a fleet view (report.id)")
	fs.StringVar(&c.DNS.Addr, "dns", c.DNS.Addr, "serve the pushed lists over DNS (UDP and TCP) at `address`, e.g. 127.0.0.1:8600: <service>.service.pushlb A/AAAA/SRV (dns.listen; docs/dns.md); empty: off")
	fs.BoolVar(&c.FleetView, "fleet-view", c.FleetView, "view every gateway's reports: /-/fleet on the admin address says which gateways are behind (fleetView)")
	fs.Func("follow", "what the gateway follows: all (every service), listed (subscriber.services and the balancer section's), requested (those and each service a request asks for); default all with -xds or -demo, listed with subscriber.services, requested otherwise", func(v string) error {
		c.Follow = pushlb.FollowMode(v)
		return nil
	})
	fs.IntVar(&c.RegistryReplicas, "registry-replicas", c.RegistryReplicas, "replicas of the registry bucket, 1 to 5, when creating it and to scale an existing one up to (0: min(3, JetStream servers))")
	fs.BoolVar(&c.Reaper, "reaper", c.Reaper, "take part in the election of the registry's reaper, which removes the records of instances whose lease ended (-reaper=false: stay out)")
	fs.BoolVar(&c.Demo, "demo", c.Demo, `also start three local backends in two zones that announce themselves (service "demo")`)
	fs.IntVar(&c.DemoPort, "demo-port", c.DemoPort, "with -demo, the first of the three consecutive ports of the demo backends on 127.0.0.1 (0: ports the system picks)")
	c.Gossip.Register(fs)
}

// parseRemoteRegion parses -remote-region's name[=domain][/bucket].
func parseRemoteRegion(v string) (serverlist.RemoteRegion, error) {
	rest, bucket, _ := strings.Cut(v, "/")
	name, domain, _ := strings.Cut(rest, "=")
	if name == "" {
		return serverlist.RemoteRegion{}, fmt.Errorf("%q: want name[=domain][/bucket]", v)
	}
	return serverlist.RemoteRegion{Name: name, Domain: domain, Bucket: bucket}, nil
}
