package pushlbcaddy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.uber.org/zap"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/balancer/lbconfig"
	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/internal/cli/gossipflag"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
)

// ClientConfig says which pushlb deployment to follow and how: the NATS
// connection, the subject prefix, and the settings of the pushlb client
// built over it. Every upstream source with an equal ClientConfig, in every
// site of every loaded config, shares one NATS connection and one
// pushlb.Client (one subscription set, one registry mirror, one gossip
// node): see the package documentation on reloads.
//
// The NATS fields mirror the flags of pushlb's gateway and announce
// (-nats, -creds, -user, ...): the same checks apply and the same
// environment variables supply secrets (PUSHLB_NATS_PASSWORD,
// PUSHLB_NATS_TOKEN, PUSHLB_NATS_NKEY_SEED_FILE).
type ClientConfig struct {
	// NATS lists the server URLs (nats://, tls://, ws://, wss://).
	// Default: nats://127.0.0.1:4222.
	NATS []string `json:"nats,omitempty"`
	// CredsFile is a NATS credentials file (JWT and NKey seed).
	CredsFile string `json:"creds_file,omitempty"`
	// User and Password (or PasswordFile) authenticate by name.
	User         string `json:"user,omitempty"`
	Password     string `json:"password,omitempty"`
	PasswordFile string `json:"password_file,omitempty"`
	// Token (or TokenFile) authenticates with a token.
	Token     string `json:"token,omitempty"`
	TokenFile string `json:"token_file,omitempty"`
	// NkeyFile is an NKey user seed file.
	NkeyFile string `json:"nkey_file,omitempty"`
	// TLSCA, TLSCert and TLSKey are PEM files: the CA that verifies the
	// server (turns TLS on), and a client certificate with its key.
	TLSCA   string `json:"tls_ca,omitempty"`
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`
	// ConnectTimeout bounds the wait for the first connection when the
	// config loads; a config whose NATS cannot be reached in that time
	// fails to load. Default 10s.
	ConnectTimeout caddy.Duration `json:"connect_timeout,omitempty"`
	// PingInterval is how often the connection pings its NATS server;
	// after two pings unanswered it is given up and made again, so that a
	// paused server or a dead link is noticed before the registry's leases
	// end. Default 5s, or a sixth of Lease when that is shorter; a value
	// given must keep two intervals below half of Lease.
	PingInterval caddy.Duration `json:"ping_interval,omitempty"`

	// Prefix is the deployment's subject prefix. Default "lb".
	Prefix string `json:"prefix,omitempty"`
	// Lease is the registry lease (pushlb.Config.Lease). Default: the
	// bucket's.
	Lease caddy.Duration `json:"lease,omitempty"`
	// Reaper makes this Caddy take part in the election of the registry's
	// reaper (pushlb.Config.Reaper). Default off: a deployment's gateways
	// usually reap.
	Reaper bool `json:"reaper,omitempty"`
	// BalancersFile is a pushlb balancer configuration (YAML or Ribbon
	// .properties, as the gateway's): rule, zone filter, breaker per
	// service. Default: pushlb's defaults (ZoneAvoidance, ZonePreference,
	// breaker threshold 3).
	BalancersFile string `json:"balancers_file,omitempty"`
	// Rule is the rule of every service that BalancersFile does not give
	// one of its own (ZoneAvoidance, RoundRobin, Random, BestAvailable,
	// LeastRequest, WeightedResponseTime, AvailabilityFiltering, Retry,
	// Maglev, Rendezvous). Default: BalancersFile's default, else
	// ZoneAvoidance.
	Rule string `json:"rule,omitempty"`
	// Gossip makes the client a gossip member with the gateway role, so
	// that a crashed instance (announce -gossip <this address>) leaves the
	// lists within the profile's detection time. Default nil: off.
	Gossip *Gossip `json:"gossip,omitempty"`
}

// Gossip holds the gossip settings (the gateway's -gossip-* flags).
type Gossip struct {
	// Bind is the host:port gossip listens on, which instances join.
	// Default 0.0.0.0:7946.
	Bind string `json:"bind,omitempty"`
	// Join lists other gateways' gossip addresses.
	Join []string `json:"join,omitempty"`
	// Profile is "lan" (default) or "fast" (a crash noticed in ~1 s); the
	// same on every node.
	Profile string `json:"profile,omitempty"`
	// KeyFile holds the base64 key that encrypts gossip. Default: the
	// environment's PUSHLB_GOSSIP_KEY, else none.
	KeyFile string `json:"key_file,omitempty"`
	// Label keeps clusters that share a network apart.
	Label string `json:"label,omitempty"`
}

// natsConfig is c's NATS connection in natsconn's terms.
func (c ClientConfig) natsConfig() natsconn.Config {
	return natsconn.Config{
		URL: strings.Join(c.NATS, ","), Name: "caddy (pushlb)",
		CredsFile: c.CredsFile, User: c.User, Password: c.Password, PasswordFile: c.PasswordFile,
		Token: c.Token, TokenFile: c.TokenFile, NkeyFile: c.NkeyFile,
		TLSCA: c.TLSCA, TLSCert: c.TLSCert, TLSKey: c.TLSKey,
		ConnectTimeout: time.Duration(c.ConnectTimeout), PingInterval: time.Duration(c.PingInterval),
	}.ForLease(time.Duration(c.Lease))
}

// settings is g in gossipflag's terms.
func (g *Gossip) settings() gossipflag.Settings {
	return gossipflag.Settings{Bind: g.Bind, Join: strings.Join(g.Join, ","), Profile: g.Profile, KeyFile: g.KeyFile, Label: g.Label}
}

// prepared is a ClientConfig checked and read: what builds a client, and the
// key that identifies it in the pool.
type prepared struct {
	nats      natsconn.Config
	cfg       pushlb.Config
	key       string // the pool key: the settings and the balancer file's content
	name      string // for logs: the URLs (without secrets) and the prefix
	balancers string // the balancers file, for the key
}

// prepare checks c without touching the network and reads the balancer
// file. Errors name the setting.
func (c ClientConfig) prepare() (*prepared, error) {
	p := &prepared{nats: c.natsConfig()}
	if err := p.nats.Validate(); err != nil {
		return nil, fmt.Errorf("nats settings: %w", err)
	}
	if err := p.nats.ValidateLease(time.Duration(c.Lease)); err != nil {
		return nil, fmt.Errorf("ping_interval: %w", err)
	}
	if c.ConnectTimeout < 0 {
		return nil, fmt.Errorf("connect_timeout %v is negative", time.Duration(c.ConnectTimeout))
	}
	p.cfg = pushlb.Config{Prefix: c.Prefix, Lease: time.Duration(c.Lease), Reaper: c.Reaper}
	if c.BalancersFile != "" {
		b, err := os.ReadFile(c.BalancersFile)
		if err != nil {
			return nil, fmt.Errorf("balancers_file: %w", err)
		}
		cc, err := lbconfig.LoadFile(c.BalancersFile)
		if err != nil {
			return nil, fmt.Errorf("balancers_file %s: %w", c.BalancersFile, err)
		}
		p.cfg.Balancers, p.balancers = cc, string(b)
	}
	if c.Rule != "" {
		if p.cfg.Balancers == nil {
			p.cfg.Balancers = balancer.DefaultClientsConfig()
		}
		p.cfg.Balancers.Defaults.Rule = c.Rule
	}
	if c.Gossip != nil {
		g, err := c.Gossip.settings().Config(gossip.Meta{Role: gossip.RoleGateway}, zerolog.Nop())
		if err != nil {
			return nil, err // gossip's errors say "gossip:"
		}
		p.cfg.Gossip = &g
	}
	if err := p.cfg.Validate(); err != nil {
		return nil, err
	}
	k, err := json.Marshal(struct {
		R         ClientConfig
		Balancers string
	}{c, p.balancers})
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(k)
	p.key = "pushlb/" + hex.EncodeToString(sum[:])
	prefix := c.Prefix
	if prefix == "" {
		prefix = "lb"
	}
	urls := "nats://127.0.0.1:4222"
	if len(c.NATS) > 0 {
		urls = strings.Join(c.NATS, ",")
	}
	p.name = redact(urls) + " prefix " + prefix
	return p, nil
}

// redact hides the user information of URLs (passwords, tokens).
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		if at := strings.LastIndex(u, "@"); at >= 0 {
			scheme := ""
			if s := strings.Index(u, "://"); s >= 0 && s < at {
				scheme = u[:s+3]
			}
			parts[i] = scheme + "***@" + u[at+1:]
		}
	}
	return strings.Join(parts, ",")
}

// shared is what the pool holds per ClientConfig: the connection and the
// started client. It is destroyed when the last config using it is
// unloaded.
type shared struct {
	name   string
	nc     *nats.Conn
	client *pushlb.Client
	log    zerolog.Logger
}

// Destruct closes the client, then the connection (caddy.Destructor).
func (s *shared) Destruct() error {
	s.client.Close()
	s.nc.Close()
	s.log.Info().Msg("pushlb client closed: no loaded config uses this registry any more")
	return nil
}

// pool holds the shared clients across config reloads: a config that
// names the same ClientConfig as the running one takes the running client
// (the lists it holds, its subscriptions, its gossip node) instead of
// building another, and the old config's cleanup only drops its
// reference. Caddy's own modules keep such resources in package-level
// UsagePools the same way (reverseproxy's hosts).
var pool = caddy.NewUsagePool()

// acquire returns the shared client of p, connecting and starting it when
// no loaded config has it yet. The caller releases it with release(p.key)
// once, when acquire succeeded.
func acquire(p *prepared) (*shared, error) {
	v, _, err := pool.LoadOrNew(p.key, func() (caddy.Destructor, error) { return open(p) })
	if err != nil {
		return nil, err
	}
	return v.(*shared), nil
}

// release drops one reference to the shared client of key.
func release(key string) error {
	_, err := pool.Delete(key)
	return err
}

// open connects to NATS and starts a client. Its logs go to Caddy's
// default logger, named "pushlb" (the logger of the config that opened it
// would be gone after a reload).
func open(p *prepared) (*shared, error) {
	log := zerolog.New(zapWriter{logger: func() *zap.Logger { return caddy.Log().Named("pushlb") }}).
		With().Str("registry", p.name).Logger()
	timeout := p.nats.ConnectTimeout
	if timeout == 0 {
		timeout = natsconn.DefaultConnectTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	nc, err := natsconn.Connect(ctx, p.nats, log)
	if err != nil {
		return nil, err
	}
	cfg := p.cfg
	if cfg.Gossip != nil {
		g := *cfg.Gossip
		cfg.Gossip = &g
	}
	c, err := pushlb.New(nc, cfg, pushlb.WithLogger(log))
	if err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		c.Close()
		nc.Close()
		return nil, err
	}
	log.Info().Str("gossip", c.GossipAddr()).Msg("pushlb client started")
	return &shared{name: p.name, nc: nc, client: c, log: log}, nil
}
