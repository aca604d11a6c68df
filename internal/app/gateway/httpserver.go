package gateway

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HTTPConfig bounds what a client can hold on the proxy listener: how long
// it may take to send a request, how long an idle keep-alive connection
// stays open, how large the headers may be, and how many connections are
// served at once. The admin listener uses the same timeouts and header
// limit, without the connection limit.
type HTTPConfig struct {
	// ReadHeaderTimeout bounds the reading of a request's headers. Zero
	// means ReadTimeout. Default 10s.
	ReadHeaderTimeout time.Duration `yaml:"readHeaderTimeout"`
	// ReadTimeout bounds the reading of a whole request, body included,
	// from its first byte: a client that sends its body slowly is cut off
	// after it. It does not limit the response: once the body has been
	// read, a stream (server-sent events, a long download, a WebSocket)
	// runs as long as it needs. Uploads that take longer need a larger
	// value. Zero means none. Default 60s. Flag -http-read-timeout.
	ReadTimeout time.Duration `yaml:"readTimeout"`
	// WriteTimeout bounds the writing of a whole response, from the end of
	// the request's headers. It cuts every stream that lasts longer, so it
	// is off by default; set it when the services send no streams. Zero
	// means none. Default 0. Flag -http-write-timeout.
	WriteTimeout time.Duration `yaml:"writeTimeout"`
	// IdleTimeout is how long a keep-alive connection may wait for its next
	// request before the gateway closes it. Zero means ReadTimeout.
	// Default 75s (nginx's keepalive_timeout: longer than the 60 s idle
	// timeout of common load balancers in front, so that they close
	// first). Flag -http-idle-timeout.
	IdleTimeout time.Duration `yaml:"idleTimeout"`
	// MaxHeaderBytes bounds the size of a request's headers, request line
	// included; larger ones get 431. Zero means net/http's default, 1 MiB.
	// Default 64 KiB (Envoy's max_request_headers_kb is 60).
	MaxHeaderBytes int `yaml:"maxHeaderBytes"`
	// MaxConns is the number of proxy connections served at once. A
	// connection beyond it waits, accepted but unread, until another
	// closes; the next ones wait in the kernel's listen backlog. Zero means
	// no limit. Default 10000. Flag -http-max-conns.
	MaxConns int `yaml:"maxConns"`
}

// DefaultHTTPConfig returns the defaults of the proxy listener.
func DefaultHTTPConfig() HTTPConfig {
	return HTTPConfig{
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       75 * time.Second,
		MaxHeaderBytes:    64 << 10,
		MaxConns:          10000,
	}
}

// problems reports every negative setting, under the key http.
func (c HTTPConfig) problems() problems {
	var ps problems
	for _, d := range []struct {
		key string
		d   time.Duration
	}{
		{"readHeaderTimeout", c.ReadHeaderTimeout}, {"readTimeout", c.ReadTimeout},
		{"writeTimeout", c.WriteTimeout}, {"idleTimeout", c.IdleTimeout},
	} {
		if d.d < 0 {
			ps = append(ps, problem{key: "http." + d.key, msg: fmt.Sprintf("%v is negative", d.d)})
		}
	}
	if c.MaxHeaderBytes < 0 {
		ps = append(ps, problem{key: "http.maxHeaderBytes", msg: fmt.Sprintf("%d is negative", c.MaxHeaderBytes)})
	}
	if c.MaxConns < 0 {
		ps = append(ps, problem{key: "http.maxConns", msg: fmt.Sprintf("%d is negative", c.MaxConns)})
	}
	return ps
}

// RegisterFlags registers -http-read-timeout, -http-write-timeout,
// -http-idle-timeout and -http-max-conns on fs, bound to c's fields.
func (c *HTTPConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.ReadTimeout, "http-read-timeout", c.ReadTimeout, "proxy: time to read a whole request, body included (0: none)")
	fs.DurationVar(&c.WriteTimeout, "http-write-timeout", c.WriteTimeout, "proxy: time to write a whole response; cuts longer streams (0: none)")
	fs.DurationVar(&c.IdleTimeout, "http-idle-timeout", c.IdleTimeout, "proxy: time a keep-alive connection may stay idle (0: the read timeout)")
	fs.IntVar(&c.MaxConns, "http-max-conns", c.MaxConns, "proxy: connections served at once; more wait (0: no limit)")
}

// server returns an http.Server for h with these limits (net/http's own
// meaning of zero, which the field docs follow).
func (c HTTPConfig) server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       c.ReadTimeout,
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       c.IdleTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
	}
}

// limitListener serves at most max connections at a time (all when max is
// 0) and counts them. Accept takes the next connection from the kernel;
// when max are open, it holds that one, unread, until another closes, so
// that the wait is seen and counted (x/net/netutil's LimitListener waits
// before accepting instead).
type limitListener struct {
	net.Listener
	max      int
	sem      chan struct{} // one token per open connection; nil without a limit
	closed   chan struct{}
	closeErr error
	once     sync.Once

	open     atomic.Int64
	accepted atomic.Uint64
	waits    atomic.Uint64
}

func newLimitListener(ln net.Listener, max int) *limitListener {
	l := &limitListener{Listener: ln, max: max, closed: make(chan struct{})}
	if max > 0 {
		l.sem = make(chan struct{}, max)
	}
	return l
}

// Accept returns the next connection once it may be served.
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if l.sem != nil {
		select {
		case l.sem <- struct{}{}:
		default:
			l.waits.Add(1)
			select {
			case l.sem <- struct{}{}:
			case <-l.closed:
				c.Close()
				return nil, fmt.Errorf("gateway: accept: %w", net.ErrClosed)
			}
		}
	}
	l.accepted.Add(1)
	l.open.Add(1)
	return &limitConn{Conn: c, l: l}, nil
}

// Close closes the listener and ends a wait in Accept.
func (l *limitListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.closeErr = l.Listener.Close()
	})
	return l.closeErr
}

// limitConn gives its slot back when closed, once, whoever closes it (the
// server, or the proxy after a hijack for an upgrade).
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		if c.l.sem != nil {
			<-c.l.sem
		}
	})
	return err
}

// CloseWrite half-closes a TCP connection, as net/http does before closing
// one whose request it refused.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

var (
	descHTTPConns    = prometheus.NewDesc("pushlb_http_connections", "Proxy connections open (being served, idle or upgraded).", nil, nil)
	descHTTPLimit    = prometheus.NewDesc("pushlb_http_connections_limit", "Proxy connections served at once at most (http.maxConns); 0: no limit.", nil, nil)
	descHTTPAccepted = prometheus.NewDesc("pushlb_http_connections_accepted_total", "Proxy connections accepted.", nil, nil)
	descHTTPWaits    = prometheus.NewDesc("pushlb_http_connection_waits_total", "Proxy connections that had to wait for a slot because http.maxConns were open.", nil, nil)
)

// listenerCollector exports a limitListener's counts.
type listenerCollector struct{ l *limitListener }

func (c listenerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHTTPConns, descHTTPLimit, descHTTPAccepted, descHTTPWaits} {
		ch <- d
	}
}

func (c listenerCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descHTTPConns, prometheus.GaugeValue, float64(c.l.open.Load()))
	ch <- prometheus.MustNewConstMetric(descHTTPLimit, prometheus.GaugeValue, float64(c.l.max))
	ch <- prometheus.MustNewConstMetric(descHTTPAccepted, prometheus.CounterValue, float64(c.l.accepted.Load()))
	ch <- prometheus.MustNewConstMetric(descHTTPWaits, prometheus.CounterValue, float64(c.l.waits.Load()))
}

var (
	_ net.Listener         = (*limitListener)(nil)
	_ prometheus.Collector = listenerCollector{}
)
