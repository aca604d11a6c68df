package dns

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/rs/zerolog"
)

// Defaults of Config.
const (
	// DefaultAddr is where the responder listens: Consul's DNS port, on
	// loopback.
	DefaultAddr = "127.0.0.1:8600"
	// DefaultDomain is the domain the responder is authoritative for.
	DefaultDomain = "pushlb."
	// DefaultFollowWait bounds a query's wait for a service it makes the
	// client follow.
	DefaultFollowWait = 2 * time.Second
	// DefaultMaxConcurrent bounds the UDP queries answered at once.
	DefaultMaxConcurrent = 1024
	// DefaultMaxTCPConns bounds the TCP connections open at once.
	DefaultMaxTCPConns = 256
	// MaxTTL bounds Config.TTL: a list pushed in milliseconds and cached
	// for longer than this would defeat the point.
	MaxTTL = time.Hour
)

// Config configures a Server. The zero value is the default configuration:
// in every field, zero means the default that DefaultConfig shows.
type Config struct {
	// Addr is the UDP and TCP address to listen on ("host:port"; port 0
	// picks a free one for both). Default 127.0.0.1:8600.
	Addr string `yaml:"listen"`
	// Domain is the domain the responder is authoritative for; service
	// names are <service>.service.<Domain>. Default "pushlb.".
	Domain string `yaml:"domain"`
	// TTL is the time to live of every answer, in whole seconds. Default 0:
	// no resolver or client caches an answer, so the first query after a
	// change sees it; the cost is a query to the responder per lookup.
	// Raise it (1 s to a few seconds) when a shared caching resolver
	// forwards heavy traffic here and a change may take that long to be
	// seen. At most MaxTTL.
	TTL time.Duration `yaml:"ttl"`
	// Zone is the responder's zone: without a zone label in the name, A
	// and AAAA prefer its instances and SRV gives them priority 1. Default
	// none (the gateway passes its -zone).
	Zone string `yaml:"zone"`
	// MaxAnswers caps the address and SRV records of one answer, over UDP
	// and TCP alike (rotation spreads the askers over all the instances).
	// Default 0: every instance, as many as fit a UDP answer (the rest
	// dropped with TC set, so that the asker retries over TCP, which
	// answers in full).
	MaxAnswers int `yaml:"maxAnswers"`
	// FollowWait bounds the wait of a query for a service the client does
	// not follow yet (see the package doc); beyond it the query is answered
	// SERVFAIL and the follow goes on, for the asker's retry. Default 2 s.
	FollowWait time.Duration `yaml:"followWait"`
	// MaxConcurrent bounds the UDP queries answered at once. Default 1,024.
	MaxConcurrent int `yaml:"maxConcurrent"`
	// MaxTCPConns bounds the TCP connections open at once. Default 256.
	MaxTCPConns int `yaml:"maxTCPConns"`
	// Logger receives the start, the stop and serving errors. Default none.
	Logger *zerolog.Logger `yaml:"-"`
}

// DefaultConfig returns the defaults, as the zero Config takes them.
func DefaultConfig() Config {
	return Config{
		Addr:          DefaultAddr,
		Domain:        DefaultDomain,
		FollowWait:    DefaultFollowWait,
		MaxConcurrent: DefaultMaxConcurrent,
		MaxTCPConns:   DefaultMaxTCPConns,
	}
}

// Validate reports every invalid field of c, in one error wrapping
// ErrInvalidConfig; New reports the same.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults checks c and fills its zero fields; its error wraps
// ErrInvalidConfig and names every bad field.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Addr == "" {
		c.Addr = d.Addr
	}
	if c.Domain == "" {
		c.Domain = d.Domain
	}
	if c.FollowWait == 0 {
		c.FollowWait = d.FollowWait
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = d.MaxConcurrent
	}
	if c.MaxTCPConns == 0 {
		c.MaxTCPConns = d.MaxTCPConns
	}
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		bad("Addr: %q: %v", c.Addr, err)
	}
	c.Domain = mdns.CanonicalName(c.Domain)
	if _, ok := mdns.IsDomainName(c.Domain); !ok || c.Domain == "." {
		bad("Domain: %q is not a domain name", c.Domain)
	}
	if c.TTL < 0 || c.TTL > MaxTTL {
		bad("TTL: %v: 0 to %v", c.TTL, MaxTTL)
	} else if c.TTL%time.Second != 0 {
		bad("TTL: %v: DNS counts whole seconds", c.TTL)
	}
	if strings.ContainsAny(c.Zone, ". ") {
		bad("Zone: %q: one DNS label", c.Zone)
	}
	if c.MaxAnswers < 0 {
		bad("MaxAnswers: %d is negative", c.MaxAnswers)
	}
	if c.FollowWait < 0 {
		bad("FollowWait: %v is negative", c.FollowWait)
	}
	if c.MaxConcurrent < 0 {
		bad("MaxConcurrent: %d is negative", c.MaxConcurrent)
	}
	if c.MaxTCPConns < 0 {
		bad("MaxTCPConns: %d is negative", c.MaxTCPConns)
	}
	return c, errors.Join(errs...)
}
