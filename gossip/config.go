package gossip

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// DefaultPort is the gossip port of a gateway or a seed whose BindAddr is
// empty: memberlist's customary 7946, for both UDP and TCP. An instance that
// joins others binds a free port instead (see Config.BindAddr).
const DefaultPort = 7946

// Defaults for JoinRetry fields left zero.
const (
	DefaultJoinRetryInitial = 200 * time.Millisecond
	DefaultJoinRetryMax     = 10 * time.Second
)

// DefaultBroadcastTimeout is how long Leave and UpdateMeta wait for their
// broadcast when given a timeout of zero or less.
const DefaultBroadcastTimeout = 5 * time.Second

// Profile names a set of memberlist timings: how often nodes probe each
// other, how long they wait for answers, how long a suspect is given to
// refute. See the package documentation for the detection time each gives.
type Profile string

const (
	// ProfileLAN is memberlist.DefaultLANConfig unchanged: a probe every
	// second, suspicion for 4·log10(N) probe intervals. Conservative and
	// cheap; a crash is noticed in about 6 to 10 seconds. The default.
	ProfileLAN Profile = "lan"

	// ProfileFast notices a crash in well under a second on a LAN or
	// loopback (a frozen host: its process stopped, its connections open,
	// so no NATS advisory tells of it), at ten times LAN's probe traffic: a
	// probe every 100 ms with a 50 ms timeout, suspicion for 3·log10(N)
	// probe intervals (at least 300 ms, twice that without a
	// confirmation), gossip every 50 ms. Use it where round trips are well
	// under 50 ms and processes are not starved of CPU for hundreds of
	// milliseconds: a live node that cannot answer or refute for about
	// 300 to 600 ms is declared dead (and comes back when it refutes).
	ProfileFast Profile = "fast"
)

// JoinRetry is the backoff of the background join. Joining starts at once,
// and after a round in which no peer answered it waits Initial, then twice
// that, and so on up to Max (each wait jittered by ±20%).
type JoinRetry struct {
	// Initial is the wait after the first failed round. Zero means
	// DefaultJoinRetryInitial (200 ms).
	Initial time.Duration

	// Max caps the wait between rounds. Zero means DefaultJoinRetryMax
	// (10 s), or Initial if Initial is larger.
	Max time.Duration
}

// Config configures a gossip Node. The zero value is not usable: Meta.Role
// is required. Every other field has a documented default.
type Config struct {
	// BindAddr is the "host:port" to listen on, for UDP and TCP alike. The
	// host may be an IP literal or a name resolved once at Start; an empty
	// host means all interfaces (0.0.0.0). Port 0 picks a free port; read it
	// back with Node.LocalAddr.
	//
	// Empty depends on the node's part. An instance that joins others
	// (Meta.Role RoleInstance and a Join list) binds a free port on the
	// address it advertises: the local address this host sends from to
	// reach the first Join peer that resolves (127.0.0.1 for a gateway on
	// loopback), so that it listens only where its peers reach it; when no
	// peer resolves at Start, "0.0.0.0:0". Several instances share a host,
	// and nobody dials an instance first (it joins the gateways, and
	// publishes Node.Name and Node.LocalAddr in its registry record, where
	// the gateways check them). A gateway, or a node that joins nobody (a
	// seed), binds "0.0.0.0:7946" (DefaultPort), the fixed address the
	// others join.
	//
	// Without a SecretKey, Start logs a warning when the bound host is not
	// a loopback address: anything that reaches the port can join.
	BindAddr string

	// AdvertiseAddr is the "host:port" other nodes should use to reach this
	// one, when it differs from BindAddr (NAT, containers). Port 0 means the
	// bound port; a non-zero port needs a non-zero BindAddr port, since
	// memberlist advertises a randomly picked port as it is. Empty means
	// BindAddr's host, or, when that is 0.0.0.0 or ::, the local address
	// this host sends from to reach the first Join peer that resolves (so
	// an instance that joins a gateway on 127.0.0.1 advertises 127.0.0.1),
	// and for a node without peers the first private address of the
	// machine (memberlist's choice).
	AdvertiseAddr string

	// Join lists peers to join, each "host:port", "host" (then the port is
	// this node's bound port) or "name/host:port". Joining runs in the
	// background and retries (see JoinRetry) until one peer answers, and
	// again whenever this node finds itself alone; a node with no reachable
	// peer is running, not failed. Empty means this node only waits to be
	// joined (a seed).
	Join []string

	// Profile picks the probe and suspicion timings. Empty means ProfileLAN.
	// All nodes of a cluster should use the same profile.
	Profile Profile

	// SecretKey turns on encryption and authentication of all gossip with
	// AES-GCM; it must be 16, 24 or 32 bytes (AES-128, -192, -256). Nodes
	// with different keys, or with and without a key, do not join each
	// other. Nil means plain text: any host that reaches the port can join
	// the cluster, claim to be anything and gossip about the others (Start
	// warns when the bound host is not a loopback address).
	SecretKey []byte

	// Label is put on every packet and stream (and authenticated when a
	// SecretKey is set); nodes with different labels ignore each other. It
	// keeps clusters that share a network apart. At most 255 bytes. Empty
	// means no label.
	Label string

	// NodeName is this node's name, unique in the cluster. Empty means
	// DefaultNodeName(Meta). At most MaxNodeNameLength bytes, valid UTF-8.
	NodeName string

	// Meta is what this node tells the others about itself. Required: its
	// Role at least; see Meta.
	Meta Meta

	// JoinRetry is the backoff of the background join. Zero fields take the
	// defaults described on JoinRetry.
	JoinRetry JoinRetry

	// Logger receives the Node's own messages and memberlist's, the latter
	// at debug level with memberlist's level in the "memberlist_level"
	// field. The zero value discards everything.
	Logger zerolog.Logger
}

// Validate reports whether New would accept c, without touching the
// network. The error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	_, err := c.check()
	return err
}

// checked is a Config after validation, with defaults filled in.
type checked struct {
	bindHost      string
	bindPort      int
	bindRoute     bool // bind the address advertised to the Join peers (BindAddr empty, an instance joining)
	advertiseHost string
	advertisePort int
	name          string
	meta          []byte
	retry         JoinRetry
	profile       Profile
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

func (c Config) check() (checked, error) {
	var out checked
	var err error

	bind := c.BindAddr
	if bind == "" {
		bind = net.JoinHostPort("0.0.0.0", strconv.Itoa(c.defaultPort()))
		out.bindRoute = c.defaultPort() == 0 && c.AdvertiseAddr == ""
	}
	if out.bindHost, out.bindPort, err = splitAddr(bind); err != nil {
		return out, invalid("BindAddr %q: %v", c.BindAddr, err)
	}
	if out.bindHost == "" {
		out.bindHost = "0.0.0.0"
	}
	if c.AdvertiseAddr != "" {
		if out.advertiseHost, out.advertisePort, err = splitAddr(c.AdvertiseAddr); err != nil {
			return out, invalid("AdvertiseAddr %q: %v", c.AdvertiseAddr, err)
		}
		if out.advertiseHost == "" {
			return out, invalid("AdvertiseAddr %q: empty host", c.AdvertiseAddr)
		}
		if out.advertisePort != 0 && out.bindPort == 0 {
			return out, invalid("AdvertiseAddr %q: a fixed advertised port needs a fixed BindAddr port", c.AdvertiseAddr)
		}
	}

	for i, peer := range c.Join {
		if peer == "" {
			return out, invalid("Join[%d] is empty", i)
		}
	}

	switch n := len(c.SecretKey); n {
	case 0, 16, 24, 32:
	default:
		return out, invalid("SecretKey is %d bytes, want 16, 24 or 32", n)
	}
	if len(c.Label) > memberlist.LabelMaxSize {
		return out, invalid("Label is %d bytes, limit %d", len(c.Label), memberlist.LabelMaxSize)
	}

	switch c.Profile {
	case "":
		out.profile = ProfileLAN
	case ProfileLAN, ProfileFast:
		out.profile = c.Profile
	default:
		return out, invalid("unknown Profile %q (want %q or %q)", c.Profile, ProfileLAN, ProfileFast)
	}

	if out.meta, err = c.Meta.encode(false); err != nil {
		return out, &metaError{err}
	}

	out.name = c.NodeName
	if out.name == "" {
		out.name = DefaultNodeName(c.Meta)
	}
	if len(out.name) > MaxNodeNameLength || !utf8.ValidString(out.name) {
		return out, invalid("NodeName %q: longer than %d bytes or not valid UTF-8", c.NodeName, MaxNodeNameLength)
	}

	r := c.JoinRetry
	if r.Initial < 0 || r.Max < 0 {
		return out, invalid("JoinRetry %+v is negative", r)
	}
	if r.Initial > 0 && r.Max > 0 && r.Initial > r.Max {
		return out, invalid("JoinRetry.Initial %v is above Max %v", r.Initial, r.Max)
	}
	if r.Initial == 0 {
		r.Initial = DefaultJoinRetryInitial
	}
	if r.Max == 0 {
		r.Max = max(DefaultJoinRetryMax, r.Initial)
	}
	out.retry = r
	return out, nil
}

// defaultPort is the port of an empty BindAddr: a free one for an instance
// that joins others, DefaultPort for the nodes the others join.
func (c Config) defaultPort() int {
	if c.Meta.Role == RoleInstance && len(c.Join) > 0 {
		return 0
	}
	return DefaultPort
}

// splitAddr splits "host:port" and checks the port.
func splitAddr(addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a number from 0 to 65535", portStr)
	}
	return host, port, nil
}

// resolveHost turns a host name into an IP literal, as memberlist needs one.
func resolveHost(ctx context.Context, host string) (string, error) {
	if _, err := netip.ParseAddr(host); err == nil {
		return host, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return "", err
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("no address for %q", host)
	}
	// Prefer IPv4, as memberlist's own defaults do.
	for _, a := range addrs {
		if a.Unmap().Is4() {
			return a.Unmap().String(), nil
		}
	}
	return addrs[0].String(), nil
}

// memberlistConfig returns memberlist's config for the profile: the timings
// only; Start fills in names, addresses and delegates.
func (p Profile) memberlistConfig() *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	if p == ProfileFast {
		// Failure detection: a probe every 100 ms; a direct ping gets
		// 50 ms (loopback and LAN RTTs are well under 1 ms), the rest of
		// the interval goes to indirect and TCP pings through 3 peers.
		// Issue 21 halved both (from 200 and 100 ms) so that a frozen host
		// leaves within a second at p99: a crashed process is reported by
		// the NATS server's advisory in milliseconds, gossip is left with
		// the hosts that freeze or vanish.
		c.ProbeInterval = 100 * time.Millisecond
		c.ProbeTimeout = 50 * time.Millisecond
		c.IndirectChecks = 3
		// Suspicion: 3·log10(N) probe intervals (≥ 300 ms) once one other
		// node confirms (k = SuspicionMult-2 = 1), twice that without
		// confirmation, which leaves a live but slow node several gossip
		// rounds to refute (three times before issue 21: a bound of 2.5 s
		// for a small cluster, 1 s now).
		c.SuspicionMult = 3
		c.SuspicionMaxTimeoutMult = 2
		// Dissemination: gossip every 50 ms to 4 nodes, so suspect, dead
		// and refuting alive messages spread in a few tens of ms.
		c.GossipInterval = 50 * time.Millisecond
		c.GossipNodes = 4
		c.RetransmitMult = 4
		// Anti-entropy and housekeeping, scaled down with the rest.
		c.PushPullInterval = 10 * time.Second
		c.GossipToTheDeadTime = 10 * time.Second
		c.TCPTimeout = 2 * time.Second
	}
	return c
}

// DetectionTime returns, for a cluster of clusterSize nodes using profile p,
// the expected time from a crash to a survivor's NodeGone with ReasonDead,
// and a bound that holds unless several probe rounds in a row miss the
// crashed node or no other node confirms the suspicion. The formulas are in
// the package documentation. An unknown profile gives zeros; an empty one is
// ProfileLAN.
func (p Profile) DetectionTime(clusterSize int) (expected, bound time.Duration) {
	if p == "" {
		p = ProfileLAN
	}
	if p != ProfileLAN && p != ProfileFast {
		return 0, 0
	}
	c := p.memberlistConfig()
	lo, hi := suspicionTimeouts(c, clusterSize)
	expected = 2*c.ProbeInterval + lo + c.GossipInterval
	bound = 3*c.ProbeInterval + hi + 2*c.GossipInterval
	return expected, bound
}

// suspicionTimeouts mirrors memberlist's suspicion timer (state.go,
// suspicion.go): min = SuspicionMult·max(1, log10(N))·ProbeInterval, reached
// after k = SuspicionMult-2 independent confirmations (or at once when fewer
// than k other nodes could confirm); max = SuspicionMaxTimeoutMult·min
// without any confirmation.
func suspicionTimeouts(c *memberlist.Config, n int) (lo, hi time.Duration) {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	lo = time.Duration(c.SuspicionMult) * time.Duration(scale*1000) * c.ProbeInterval / 1000
	k := c.SuspicionMult - 2
	if n-2 < k || k < 1 {
		return lo, lo
	}
	return lo, time.Duration(c.SuspicionMaxTimeoutMult) * lo
}
