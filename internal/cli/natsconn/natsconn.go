package natsconn

import (
	"github.com/pushlb/pushlb/internal/base/commalist"
	"github.com/pushlb/pushlb/internal/base/natsping"

	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

const (
	// DefaultURL is the server the binaries use when -nats is not given.
	DefaultURL = "nats://127.0.0.1:4222"
	// DefaultConnectTimeout bounds the wait for the first connection.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultReconnectWait is the pause between reconnect attempts once a
	// connection was established.
	DefaultReconnectWait = 250 * time.Millisecond
	// DefaultPingInterval is how often a connection pings its server when
	// -nats-ping-interval is not given: 5 s, so that with MaxPingsOut a
	// paused server or a dead link is noticed within 10 to 15 s, below
	// half the default lease (30 s). It costs one PING and one PONG per
	// interval per connection.
	DefaultPingInterval = natsping.DefaultInterval
	// MaxPingsOut is how many pings may go unanswered: the ping timer that
	// finds one more declares the connection stale, and the client
	// reconnects. Fixed: the interval is the one setting.
	MaxPingsOut = natsping.DefaultMaxOut

	// The first connection is retried after firstBackoff, doubling up to
	// maxBackoff. One attempt's dial waits for what is left of the
	// timeout, within [minDialTimeout, maxDialTimeout]: the floor keeps the
	// last attempt from failing on its own short timeout.
	firstBackoff   = 50 * time.Millisecond
	maxBackoff     = time.Second
	maxDialTimeout = 2 * time.Second
	minDialTimeout = 250 * time.Millisecond
)

// The environment variables that supply secrets kept off the command line
// and out of configuration files. A variable that is empty counts as unset.
// A secret given by flag or file (-password, -password-file...) wins over its
// variable. See [Config.Resolve] for when each one applies.
const (
	// EnvPassword is the password of -user, when neither -password nor
	// -password-file is given.
	EnvPassword = "PUSHLB_NATS_PASSWORD"
	// EnvToken is the token, when no other credentials are given.
	EnvToken = "PUSHLB_NATS_TOKEN"
	// EnvNkeySeedFile is the path of an NKey seed file (as -nkey), when no
	// other credentials are given.
	EnvNkeySeedFile = "PUSHLB_NATS_NKEY_SEED_FILE"
)

// Config describes how to reach NATS. The zero value connects to DefaultURL
// without credentials. Fields map one to one to the flags of RegisterFlags
// and to the keys of a gateway configuration file's nats section (the yaml
// tags), so both binaries and the file share one definition.
type Config struct {
	// URL is the server URL, or several separated by commas
	// ("nats://a:4222,nats://b:4222"). Empty means DefaultURL. Flag -nats.
	URL string `yaml:"url"`
	// Name is the connection name the server shows in its monitoring.
	// Empty means none. No flag: each binary names its connections.
	Name string `yaml:"-"`
	// CredsFile is a NATS credentials file (JWT and NKey seed). It excludes
	// User, Password and Token. Flag -creds.
	CredsFile string `yaml:"credsFile"`
	// User and Password authenticate with a user name and password. A
	// password needs a user; a user excludes Token. Flags -user, -password.
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// PasswordFile is a file holding the password (its content, without a
	// final line ending), so that the password is not on the command line.
	// It excludes Password and needs User. Flag -password-file.
	PasswordFile string `yaml:"passwordFile"`
	// Token authenticates with a token. Flag -token.
	Token string `yaml:"token"`
	// TokenFile is a file holding the token, as PasswordFile holds the
	// password. It excludes Token. Flag -token-file.
	TokenFile string `yaml:"tokenFile"`
	// NkeyFile is a file holding an NKey user seed ("SU..."), for plain
	// NKey authentication (a user that the server knows by its public key,
	// without a JWT). The seed is read at every connection and never kept
	// in memory. It excludes CredsFile, User and Token. Flag -nkey.
	NkeyFile string `yaml:"nkeyFile"`
	// TLSCA is a PEM file of root certificates to verify the server with;
	// setting it requires TLS. Flag -tls-ca.
	TLSCA string `yaml:"tlsCA"`
	// TLSCert and TLSKey are the PEM files of a client certificate and its
	// key, for servers that verify clients. Both or neither. Flags
	// -tls-cert, -tls-key.
	TLSCert string `yaml:"tlsCert"`
	TLSKey  string `yaml:"tlsKey"`
	// ConnectTimeout bounds the wait for the first connection, retries
	// included. Zero means DefaultConnectTimeout (10 s); negative is
	// invalid. Flag -nats-timeout.
	ConnectTimeout time.Duration `yaml:"connectTimeout"`
	// ReconnectWait is the pause between reconnect attempts after a
	// connection was lost. Zero means DefaultReconnectWait (250 ms). No
	// flag.
	ReconnectWait time.Duration `yaml:"reconnectWait"`
	// PingInterval is how often the connection pings its server; after
	// MaxPingsOut (2) pings unanswered, the next one declares the
	// connection stale and the client reconnects, so that a paused server
	// or a dead link is noticed. Zero means DefaultPingInterval (5 s), or
	// a sixth of the registry lease when that is shorter (ForLease);
	// negative is invalid. A value given must stay below a quarter of the
	// lease (MaxPingsOut pings below half of it): see ValidateLease. Flag
	// -nats-ping-interval, which refuses 0.
	PingInterval time.Duration `yaml:"pingInterval"`
}

// RegisterFlags registers the connection flags on fs, bound to c's fields,
// with c's current values as defaults (DefaultConnectTimeout for a zero
// ConnectTimeout). An empty URL stays empty: each binary says what it means
// (announce uses DefaultURL, the gateway starts an embedded server).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	fs.StringVar(&c.URL, "nats", c.URL, "NATS server `URL`s (nats://, tls://, ws:// or wss://), comma-separated")
	fs.StringVar(&c.CredsFile, "creds", c.CredsFile, "NATS credentials `file` (JWT and seed); excludes -user, -token and -nkey")
	fs.StringVar(&c.User, "user", c.User, "NATS user `name`; excludes -token and -nkey")
	// Secrets given on the command line are visible to every user of the
	// machine (ps); the -...-file flags and the environment are not.
	fs.Var(secretValue{&c.Password}, "password", "NATS `password`, with -user; prefer -password-file or "+EnvPassword)
	fs.StringVar(&c.PasswordFile, "password-file", c.PasswordFile, "`file` holding the NATS password, with -user (default $"+EnvPassword+")")
	fs.Var(secretValue{&c.Token}, "token", "NATS authentication `token`; prefer -token-file or "+EnvToken)
	fs.StringVar(&c.TokenFile, "token-file", c.TokenFile, "`file` holding the NATS token (default $"+EnvToken+")")
	fs.StringVar(&c.NkeyFile, "nkey", c.NkeyFile, "NKey user seed `file` for NKey authentication (default $"+EnvNkeySeedFile+")")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "PEM `file` of CA certificates to verify the NATS server (enables TLS)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM `file` of the client certificate, with -tls-key")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM `file` of the client key, with -tls-cert")
	fs.DurationVar(&c.ConnectTimeout, "nats-timeout", c.ConnectTimeout, "how long to retry the first connection to NATS")
	fs.Var(positiveDuration{&c.PingInterval}, "nats-ping-interval", fmt.Sprintf("ping the NATS server every `D` (default %v, or a sixth of -lease when shorter); %d pings unanswered and "+
		"the connection is given up and made again, so that a paused server or a dead link is noticed; below a quarter of -lease", DefaultPingInterval, MaxPingsOut))
}

// positiveDuration is a duration flag that refuses zero and negative
// values: -nats-ping-interval 0 would turn the pings off, not take the
// default.
type positiveDuration struct{ p *time.Duration }

func (v positiveDuration) String() string {
	if v.p == nil || *v.p == 0 {
		return "" // the default depends on the lease: the usage says it
	}
	return v.p.String()
}

func (v positiveDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("parse error")
	}
	if d <= 0 {
		return fmt.Errorf("%v is not positive", d)
	}
	*v.p = d
	return nil
}

// Validate reports conflicting or invalid options: nil, or the Problems
// it found, which wrap ErrInvalidConfig. It does not read any file.
func (c Config) Validate() error {
	var ps Problems
	bad := func(key, msg, flagMsg string) { ps = append(ps, Problem{Key: key, Msg: msg, FlagMsg: flagMsg}) }
	// One way to authenticate: a credentials file, a user, a token or an
	// NKey.
	type setting struct{ flag, key string }
	var ways []setting
	for _, w := range []struct {
		setting
		given bool
	}{
		{setting{"-creds", "credsFile"}, c.CredsFile != ""},
		{setting{"-user", "user"}, c.User != ""},
		{setting{"-token", "token"}, c.Token != ""},
		{setting{"-token-file", "tokenFile"}, c.TokenFile != ""},
		{setting{"-nkey", "nkeyFile"}, c.NkeyFile != ""},
	} {
		if w.given {
			ways = append(ways, w.setting)
		}
	}
	if len(ways) > 1 {
		flags, keys := make([]string, len(ways)), make([]string, len(ways)-1)
		for i, w := range ways {
			flags[i] = w.flag
			if i > 0 {
				keys[i-1] = w.key
			}
		}
		bad(ways[0].key, "cannot be used with "+strings.Join(keys, " or ")+": choose one way to authenticate",
			strings.Join(flags, " and ")+" cannot be used together: choose one way to authenticate")
	}
	if c.Password != "" && c.PasswordFile != "" {
		bad("password", "cannot be used with passwordFile", "-password and -password-file cannot be used together")
	}
	if (c.Password != "" || c.PasswordFile != "") && c.User == "" {
		key := "password"
		if c.Password == "" {
			key = "passwordFile"
		}
		bad(key, "needs user", "-password needs -user")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		if c.TLSCert != "" {
			bad("tlsCert", "needs tlsKey", "-tls-cert and -tls-key go together")
		} else {
			bad("tlsKey", "needs tlsCert", "-tls-cert and -tls-key go together")
		}
	}
	if c.ConnectTimeout < 0 {
		bad("connectTimeout", fmt.Sprintf("%v is negative", c.ConnectTimeout), fmt.Sprintf("-nats-timeout %v is negative", c.ConnectTimeout))
	}
	if c.ReconnectWait < 0 {
		bad("reconnectWait", fmt.Sprintf("%v is negative", c.ReconnectWait), fmt.Sprintf("reconnect wait %v is negative", c.ReconnectWait))
	}
	if c.PingInterval < 0 {
		bad("pingInterval", fmt.Sprintf("%v is negative", c.PingInterval), fmt.Sprintf("-nats-ping-interval %v is negative", c.PingInterval))
	}
	if strings.TrimSpace(strings.ReplaceAll(c.URL, ",", "")) == "" && c.URL != "" {
		bad("url", fmt.Sprintf("%q names no server", c.URL), fmt.Sprintf("-nats %q names no server", c.URL))
	}
	for _, u := range commalist.Split(c.URL) {
		if err := checkURL(u); err != nil {
			bad("url", fmt.Sprintf("%q: %v", redactURLs(u), err), fmt.Sprintf("-nats %q: %v", redactURLs(u), err))
		}
	}
	if len(ps) > 0 {
		return ps
	}
	return nil
}

// ValidateLease reports a PingInterval too long for lease, the registry
// lease the program was given (announce's -lease, the gateway's lease):
// MaxPingsOut intervals must be below half the lease, so that a paused
// server or a dead link is noticed, and the connection made again, before
// the lease ends (10 s of 30 s by default). It returns nil or Problems that
// wrap ErrInvalidConfig. A PingInterval left zero is not checked: ForLease
// fits its default to the lease. Nor is a lease of zero (the bucket's,
// unknown before the registry is opened): publisher.New and pushlb's
// Client.Start warn then, with the bucket's lease.
func (c Config) ValidateLease(lease time.Duration) error {
	interval := c.PingInterval
	if lease <= 0 || interval <= 0 || !natsping.Slow(interval, MaxPingsOut, lease) {
		return nil
	}
	limit := lease / (2 * MaxPingsOut)
	detail := func(name string) string {
		return fmt.Sprintf("%d unanswered pings (%v) are not below half of %s %v (%v): a paused server or a dead link would be noticed too late; give less than %v",
			MaxPingsOut, time.Duration(MaxPingsOut)*interval, name, lease, lease/2, limit)
	}
	return Problems{{
		Key:     "pingInterval",
		Msg:     fmt.Sprintf("%v: %s", interval, detail("lease")),
		FlagMsg: fmt.Sprintf("-nats-ping-interval %v: %s", interval, detail("-lease")),
	}}
}

// ForLease returns c with a PingInterval left zero fitted to lease, the
// registry lease the program was given: DefaultPingInterval, or a sixth
// of the lease when that is shorter (a lease under 30 s). A dead link is
// noticed after MaxPingsOut to MaxPingsOut+1 intervals, half the lease at
// most, while a publisher renews every third of it: after a link died
// just before a renewal, the reconnect and the publisher's renewal still
// have a sixth of the lease before it ends (5 s of the default 30 s). A
// PingInterval given, or a lease of zero, leaves c as it is.
func (c Config) ForLease(lease time.Duration) Config {
	if c.PingInterval == 0 && lease > 0 {
		c.PingInterval = min(DefaultPingInterval, lease/leaseIntervals)
	}
	return c
}

// leaseIntervals is how many ping intervals ForLease fits in a lease.
const leaseIntervals = 6

// Refit returns c fitted to ttl, the registry bucket's lease read once
// connected, when c left PingInterval zero and was not fitted to a lease
// (the program was told to take the bucket's, -lease 0) and ForLease
// would ping more often than the default for it (a lease under 30 s): ok
// says the connection should be made again with it. A PingInterval given is the
// user's (ValidateLease judged it, or a warning says it is slow).
func (c Config) Refit(ttl time.Duration) (fitted Config, ok bool) {
	if c.PingInterval != 0 || ttl <= 0 {
		return c, false
	}
	if fitted = c.ForLease(ttl); fitted.PingInterval >= DefaultPingInterval {
		return c, false
	}
	return fitted, true
}

// Schemes are the URL schemes nats.go connects with: plain, TLS, and
// WebSocket without and with TLS. A URL without "://" is taken as nats://.
var schemes = []string{"nats", "tls", "ws", "wss"}

// checkURL reports a server URL that nats.go would misread: an unknown
// scheme (nats.go dials any scheme as plain NATS, so "nat://" would pass
// for "nats://" and "https://" would connect without TLS), or no host.
func checkURL(raw string) error {
	if !strings.Contains(raw, "://") {
		raw = "nats://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.Unwrap(err) // url.Error repeats the URL, secrets included
	}
	if !slices.Contains(schemes, u.Scheme) {
		return fmt.Errorf("unknown scheme %q (want %s)", u.Scheme, strings.Join(schemes, ", "))
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	return nil
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = DefaultReconnectWait
	}
	if c.PingInterval == 0 {
		c.PingInterval = DefaultPingInterval
	}
	return c
}

// Connect connects to NATS as c describes. It retries the first connection
// with backoff until c.ConnectTimeout has passed or ctx ends; an error that
// retrying cannot cure (bad credentials, a TLS failure) ends it at once.
// The connection it returns reconnects forever and logs connection changes
// to log. The caller closes it.
//
// Errors wrap ErrInvalidConfig (bad options), ErrNotNATS (a server that
// does not speak NATS, such as an HTTP port: at once), ErrUnreachable (the
// timeout ran out; the message reads "cannot reach NATS at URL after D:
// cause"), ctx.Err(), or the client's own error (for example
// nats.ErrAuthorization).
func Connect(ctx context.Context, c Config, log zerolog.Logger) (*nats.Conn, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c, err := c.Resolve()
	if err != nil {
		return nil, err
	}
	c = c.withDefaults()
	shown := redactURLs(c.URL)
	opts, err := c.options(shown, log)
	if err != nil {
		return nil, err
	}

	deadline := time.Now().Add(c.ConnectTimeout)
	backoff := firstBackoff
	silent := "" // a server that accepted a connection and said nothing
	probed := map[string]bool{}
	for attempt := 1; ; attempt++ {
		opts.Timeout = min(maxDialTimeout, max(time.Until(deadline), minDialTimeout))
		nc, err := opts.Connect()
		if err == nil {
			log.Info().Str("url", redactURLs(nc.ConnectedUrl())).Int("attempts", attempt).Msg("connected to NATS")
			return nc, nil
		}
		if errors.Is(err, nats.ErrNoInfoReceived) {
			return nil, fmt.Errorf("connect to NATS at %s: %w: its first line is not NATS's INFO (%w)", shown, ErrNotNATS, err)
		}
		if addr, ok := silentServer(err); ok && !probed[addr] {
			probed[addr] = true
			if status, isHTTP := answersHTTP(ctx, addr); isHTTP {
				return nil, fmt.Errorf("connect to NATS at %s: %w: %s is an HTTP server (it answered %q); "+
					"-nats wants a NATS client port (4222 by default), not an HTTP one such as a gateway's proxy or admin port or NATS monitoring (8222)", shown, ErrNotNATS, addr, status)
			}
		}
		if addr, ok := silentServer(err); ok {
			silent = addr
		}
		if !transient(err) {
			return nil, fmt.Errorf("connect to NATS at %s: %w", shown, err)
		}
		wait := min(backoff, time.Until(deadline))
		if wait <= 0 {
			return nil, &unreachableError{url: shown, after: c.ConnectTimeout, err: err, silent: silent}
		}
		log.Debug().Err(err).Str("url", shown).Stringer("retry_in", wait).Msg("NATS not reachable yet")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("connect to NATS at %s: %w", shown, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// options builds the client options, reading the TLS files so that a
// missing file is reported as a configuration error, not as an unreachable
// server.
func (c Config) options(shown string, log zerolog.Logger) (nats.Options, error) {
	opts := nats.GetDefaultOptions()
	var list []nats.Option
	list = append(list,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(c.ReconnectWait),
		nats.PingInterval(c.PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() { // Close also reports a disconnect
				return
			}
			ev := log.Warn().Str("url", shown)
			if err != nil {
				ev = ev.Err(err)
			}
			ev.Msg("disconnected from NATS; reconnecting")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info().Str("url", redactURLs(nc.ConnectedUrl())).Msg("reconnected to NATS")
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			log.Debug().Str("url", shown).Msg("NATS connection closed")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := log.Error().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS error")
		}),
	)
	if c.Name != "" {
		list = append(list, nats.Name(c.Name))
	}
	if c.CredsFile != "" {
		if _, err := os.Stat(c.CredsFile); err != nil {
			return opts, fmt.Errorf("%w: -creds: %w", ErrInvalidConfig, err)
		}
		list = append(list, nats.UserCredentials(c.CredsFile))
	}
	if c.User != "" {
		list = append(list, nats.UserInfo(c.User, c.Password))
	}
	if c.NkeyFile != "" {
		// The option reads the seed now to check it, and again to sign
		// each connection's challenge.
		o, err := nats.NkeyOptionFromSeed(c.NkeyFile)
		if err != nil {
			return opts, fmt.Errorf("%w: -nkey: %w", ErrInvalidConfig, err)
		}
		list = append(list, o)
	}
	if c.Token != "" {
		list = append(list, nats.Token(c.Token))
	}
	if c.TLSCA != "" {
		list = append(list, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		list = append(list, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	opts.Servers = commalist.Split(c.URL)
	for _, o := range list {
		if err := o(&opts); err != nil {
			return opts, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	return opts, nil
}

// Resolve returns c with its secrets in place: the password and the token
// read from PasswordFile and TokenFile (without a final line ending), and
// the environment variables applied where c leaves a secret unset. Connect
// calls it; a command may call it earlier to report a problem as a usage
// error. It is idempotent.
//
// The environment applies as follows; a flag or file value always wins:
//
//   - EnvPassword is the password of User, when c has a User but no
//     Password or PasswordFile. Without a User it is ignored.
//   - EnvToken is the token and EnvNkeySeedFile the NKey seed file when c
//     has no credentials at all (no CredsFile, User, Token, TokenFile or
//     NkeyFile, and no user information in a URL). Both set is an error:
//     the choice would be a guess.
//
// Errors wrap ErrInvalidConfig; they name files and variables, never a
// secret.
func (c Config) Resolve() (Config, error) {
	if err := c.Validate(); err != nil {
		return c, err
	}
	// A URL's user information (nats://user:pass@host, nats://token@host)
	// counts as credentials given.
	none := c.CredsFile == "" && c.User == "" && c.Token == "" && c.TokenFile == "" && c.NkeyFile == "" &&
		!strings.Contains(c.URL, "@")
	if c.User != "" && c.Password == "" && c.PasswordFile == "" {
		c.Password = os.Getenv(EnvPassword)
	}
	if none {
		token, seed := os.Getenv(EnvToken), os.Getenv(EnvNkeySeedFile)
		if token != "" && seed != "" {
			return c, fmt.Errorf("%w: both %s and %s are set and no credentials are given: unset one", ErrInvalidConfig, EnvToken, EnvNkeySeedFile)
		}
		c.Token, c.NkeyFile = token, seed
	}
	if c.PasswordFile != "" {
		p, err := readSecret(c.PasswordFile)
		if err != nil {
			return c, fmt.Errorf("%w: -password-file: %w", ErrInvalidConfig, err)
		}
		c.Password, c.PasswordFile = p, ""
	}
	if c.TokenFile != "" {
		t, err := readSecret(c.TokenFile)
		if err != nil {
			return c, fmt.Errorf("%w: -token-file: %w", ErrInvalidConfig, err)
		}
		c.Token, c.TokenFile = t, ""
	}
	return c, nil
}

// maxSecretSize bounds a password or token file: a larger one is not a
// secret but a mistake (a key or a log named by error).
const maxSecretSize = 64 << 10

// readSecret reads a password or token file: its content without a final
// line ending, so that `echo secret > file` works. An empty secret is an
// error.
func readSecret(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretSize+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxSecretSize {
		return "", fmt.Errorf("%s: larger than %d bytes", path, maxSecretSize)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// secretValue is a string flag whose value is never printed: a password
// or token that a configuration file set would otherwise be shown as the
// flag's default by -h.
type secretValue struct{ p *string }

func (v secretValue) String() string {
	if v.p == nil || *v.p == "" {
		return ""
	}
	return "(hidden)"
}

func (v secretValue) Set(s string) error {
	*v.p = s
	return nil
}

// transient reports whether waiting may cure a failed first connection: the
// server is not listening yet, the network or DNS is not up yet, or the
// connection broke during the NATS handshake. A TLS failure is not.
func transient(err error) bool {
	if tlsFailure(err) {
		return false
	}
	var netErr net.Error
	return errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.As(err, &netErr)
}

// tlsFailure reports whether err is a TLS failure that a retry would meet
// again: the server refused the handshake with an alert (a client
// certificate missing, expired or signed by a CA it does not trust), or
// closed the connection right after it (nats.ErrTLS: how the refusal looks
// when the alert is lost), or the server's certificate failed verification
// here. crypto/tls reports the server's alert as a *net.OpError, which
// would otherwise pass for a network error.
func tlsFailure(err error) bool {
	if errors.Is(err, nats.ErrTLS) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		return true
	}
	var (
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
		authority x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		alert     tls.AlertError
	)
	return errors.As(err, &verify) || errors.As(err, &record) || errors.As(err, &authority) ||
		errors.As(err, &hostname) || errors.As(err, &invalid) || errors.As(err, &alert)
}

// silentServer reports whether err is a read timeout during the
// handshake, the server's address with it: the server accepted the
// connection but sent no INFO, which a NATS server sends at once.
func silentServer(err error) (string, bool) {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "read" || !op.Timeout() || op.Addr == nil {
		return "", false
	}
	return op.Addr.String(), true
}

// probeTimeout bounds each step of answersHTTP.
const probeTimeout = time.Second

// answersHTTP connects to a server that stayed silent where NATS speaks
// first, and asks it for "HEAD /" over HTTP/1.0. It returns the status line
// when the answer is HTTP (an HTTPS server answers a plain request with an
// HTTP 400 too). It writes nothing to a server that speaks first.
func answersHTTP(ctx context.Context, addr string) (string, bool) {
	d := net.Dialer{Timeout: probeTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", false
	}
	defer c.Close()
	r := bufio.NewReaderSize(c, 256)
	c.SetReadDeadline(time.Now().Add(probeTimeout / 4))
	if _, err := r.Peek(1); err == nil {
		return "", false // it speaks first: not an HTTP server, maybe a slow NATS
	}
	c.SetDeadline(time.Now().Add(probeTimeout))
	if _, err := io.WriteString(c, "HEAD / HTTP/1.0\r\n\r\n"); err != nil {
		return "", false
	}
	line, _ := r.ReadSlice('\n')
	status := strings.TrimSpace(string(line))
	if !strings.HasPrefix(status, "HTTP/") {
		return "", false
	}
	return status, true
}

// unreachableError is returned when the first connection timed out.
type unreachableError struct {
	url    string
	after  time.Duration
	err    error
	silent string // a server that accepted connections but sent no INFO
}

func (e *unreachableError) Error() string {
	msg := fmt.Sprintf("cannot reach NATS at %s after %v: %v", e.url, e.after, e.err)
	if e.silent != "" {
		msg += fmt.Sprintf(" (%s accepts connections but sends no INFO: not a NATS server, or one too busy to answer)", e.silent)
	}
	return msg
}

func (e *unreachableError) Unwrap() []error { return []error{ErrUnreachable, e.err} }

// redactURLs masks the user information of every URL in a comma-separated
// list: a token travels as the user name, so the whole of it is hidden.
func redactURLs(s string) string {
	urls := commalist.Split(s)
	for i, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.User == nil {
			if strings.Contains(raw, "@") { // unparsable but may hold secrets
				urls[i] = "***@" + raw[strings.LastIndex(raw, "@")+1:]
			}
			continue
		}
		u.User = nil
		urls[i] = strings.Replace(u.String(), "//", "//***@", 1)
	}
	return strings.Join(urls, ",")
}
