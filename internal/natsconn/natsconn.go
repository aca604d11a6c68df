package natsconn

import (
	"github.com/pushlb/pushlb/internal/commalist"

	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
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

	// The first connection is retried after firstBackoff, doubling up to
	// maxBackoff. One attempt's dial waits for what is left of the
	// timeout, within [minDialTimeout, maxDialTimeout]: the floor keeps the
	// last attempt from failing on its own short timeout.
	firstBackoff   = 50 * time.Millisecond
	maxBackoff     = time.Second
	maxDialTimeout = 2 * time.Second
	minDialTimeout = 250 * time.Millisecond
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
	// Token authenticates with a token. Flag -token.
	Token string `yaml:"token"`
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
}

// RegisterFlags registers the connection flags on fs, bound to c's fields,
// with c's current values as defaults (DefaultConnectTimeout for a zero
// ConnectTimeout). An empty URL stays empty: each binary says what it means
// (announce uses DefaultURL, the gateway starts an embedded server).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	fs.StringVar(&c.URL, "nats", c.URL, "NATS server `URL`s, comma-separated")
	fs.StringVar(&c.CredsFile, "creds", c.CredsFile, "NATS credentials `file` (JWT and seed); excludes -user, -password and -token")
	fs.StringVar(&c.User, "user", c.User, "NATS user `name`; excludes -token")
	fs.StringVar(&c.Password, "password", c.Password, "NATS `password`, with -user")
	fs.StringVar(&c.Token, "token", c.Token, "NATS authentication `token`")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "PEM `file` of CA certificates to verify the NATS server (enables TLS)")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM `file` of the client certificate, with -tls-key")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM `file` of the client key, with -tls-cert")
	fs.DurationVar(&c.ConnectTimeout, "nats-timeout", c.ConnectTimeout, "how long to retry the first connection to NATS")
}

// Validate reports conflicting or invalid options. Every error wraps
// ErrInvalidConfig. It does not read any file.
func (c Config) Validate() error {
	var problems []string
	if c.User != "" && c.Token != "" {
		problems = append(problems, "-user and -token cannot be used together")
	}
	if c.Password != "" && c.User == "" {
		problems = append(problems, "-password needs -user")
	}
	if c.CredsFile != "" && (c.User != "" || c.Password != "" || c.Token != "") {
		problems = append(problems, "-creds cannot be combined with -user, -password or -token")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		problems = append(problems, "-tls-cert and -tls-key go together")
	}
	if c.ConnectTimeout < 0 {
		problems = append(problems, fmt.Sprintf("-nats-timeout %v is negative", c.ConnectTimeout))
	}
	if c.ReconnectWait < 0 {
		problems = append(problems, fmt.Sprintf("reconnect wait %v is negative", c.ReconnectWait))
	}
	if strings.TrimSpace(strings.ReplaceAll(c.URL, ",", "")) == "" && c.URL != "" {
		problems = append(problems, fmt.Sprintf("-nats %q names no server", c.URL))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
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
	return c
}

// Connect connects to NATS as c describes. It retries the first connection
// with backoff until c.ConnectTimeout has passed or ctx ends; an error that
// retrying cannot cure (bad credentials, a TLS failure) ends it at once.
// The connection it returns reconnects forever and logs connection changes
// to log. The caller closes it.
//
// Errors wrap ErrInvalidConfig (bad options), ErrUnreachable (the timeout
// ran out; the message reads "cannot reach NATS at URL after D: cause"),
// ctx.Err(), or the client's own error (for example
// nats.ErrAuthorization).
func Connect(ctx context.Context, c Config, log zerolog.Logger) (*nats.Conn, error) {
	if err := c.Validate(); err != nil {
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
	for attempt := 1; ; attempt++ {
		opts.Timeout = min(maxDialTimeout, max(time.Until(deadline), minDialTimeout))
		nc, err := opts.Connect()
		if err == nil {
			log.Info().Str("url", redactURLs(nc.ConnectedUrl())).Int("attempts", attempt).Msg("connected to NATS")
			return nc, nil
		}
		if !transient(err) {
			return nil, fmt.Errorf("connect to NATS at %s: %w", shown, err)
		}
		wait := min(backoff, time.Until(deadline))
		if wait <= 0 {
			return nil, &unreachableError{url: shown, after: c.ConnectTimeout, err: err}
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

// transient reports whether waiting may cure a failed first connection: the
// server is not listening yet, the network or DNS is not up yet, or the
// connection broke during the handshake.
func transient(err error) bool {
	var netErr net.Error
	return errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.As(err, &netErr)
}

// unreachableError is returned when the first connection timed out.
type unreachableError struct {
	url   string
	after time.Duration
	err   error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach NATS at %s after %v: %v", e.url, e.after, e.err)
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
