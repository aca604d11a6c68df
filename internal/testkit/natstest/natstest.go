package natstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/app/natsaccounts"
)

// readyTimeout bounds how long Start and Restart wait for the server to
// accept connections. Generous: a cluster node with JetStream, under the
// race detector, while the other test packages build and run on two
// cores, once took more than 10 s (CI from a clean cache).
const readyTimeout = 30 * time.Second

// Option adjusts the server options. Options are applied, in order, every
// time the server starts, so changes made here persist across restarts.
type Option func(*server.Options)

// WithStoreDir stores JetStream data in dir instead of a fresh t.TempDir().
func WithStoreDir(dir string) Option {
	return func(o *server.Options) { o.StoreDir = dir }
}

// WithLogging makes the server log to stderr, which helps when a test fails
// for reasons only the server knows.
func WithLogging() Option {
	return func(o *server.Options) { o.NoLog = false }
}

// WithoutJetStream runs a plain NATS server, for tests of what happens
// when JetStream is not there.
func WithoutJetStream() Option {
	return func(o *server.Options) { o.JetStream = false }
}

// WithConfigFile configures the server from a nats-server configuration
// file, as `nats-server -c path` would: accounts, users and their
// permissions, TLS, JetStream. The file is parsed when the option is made
// (a parse error fails the test) and again on every start, so that a
// restart gets fresh accounts. Variables the file leaves undefined come
// from the environment, as in nats-server.
//
// Whatever the file says, the server listens on 127.0.0.1 on a random port,
// keeps its JetStream data in the test's directory (or WithStoreDir's), and
// does not log (WithLogging) or handle signals: the test owns those. JetStream
// runs only if the file enables it. Give WithConfigFile first: it replaces
// the options the ones before it set.
func WithConfigFile(tb testing.TB, path string) Option {
	tb.Helper()
	if _, err := server.ProcessConfigFile(path); err != nil {
		tb.Fatalf("natstest: config file %s: %v", path, err)
	}
	return func(o *server.Options) {
		parsed, err := server.ProcessConfigFile(path)
		if err != nil { // it parsed a moment ago: the file changed meanwhile
			panic(fmt.Sprintf("natstest: config file %s: %v", path, err))
		}
		keep := *o
		*o = *parsed
		o.ServerName = keep.ServerName
		o.Host, o.Port = keep.Host, keep.Port
		o.StoreDir = keep.StoreDir
		o.NoLog, o.NoSigs = true, true
		// The monitoring, cluster and other listeners of a production file
		// would clash between tests.
		o.HTTPPort, o.HTTPSPort = 0, 0
		o.Cluster = server.ClusterOpts{}
		o.Gateway = server.GatewayOpts{}
		o.LeafNode = server.LeafNodeOpts{}
		o.Websocket = server.WebsocketOpts{}
		o.MQTT = server.MQTTOpts{}
	}
}

// WithAdvisories runs the server with the accounts of the gateway's
// embedded server (natsaccounts.Config): clients without credentials land
// in the application account natsaccounts.Account, JetStream on, and the
// account's client-disconnect advisories imported to
// events.DisconnectAdvisorySubject(prefix). Every node of a cluster takes
// the same. Give it before options that change what it sets.
func WithAdvisories(tb testing.TB, prefix string) Option {
	tb.Helper()
	if _, err := natsaccounts.Options(prefix); err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	return func(o *server.Options) {
		parsed, err := natsaccounts.Options(prefix)
		if err != nil { // it parsed a moment ago
			panic(fmt.Sprintf("natstest: %v", err))
		}
		keep := *o
		*o = *parsed
		o.ServerName, o.Host, o.Port = keep.ServerName, keep.Host, keep.Port
		o.JetStream, o.StoreDir = keep.JetStream, keep.StoreDir
		o.NoLog, o.NoSigs = keep.NoLog, keep.NoSigs
		o.Cluster, o.Routes = keep.Cluster, keep.Routes
	}
}

// Server is an in-process nats-server with JetStream enabled. Its methods are
// safe for concurrent use.
type Server struct {
	mu       sync.Mutex
	opts     []Option
	storeDir string
	port     int            // server.RANDOM_PORT until the first start
	host     string         // the address the server listens on
	srv      *server.Server // nil while shut down
}

// Start starts a nats-server with JetStream on 127.0.0.1 and a random port,
// waits until it accepts connections, and registers its shutdown with
// tb.Cleanup. It fails the test if the server cannot start.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s := &Server{opts: opts, storeDir: tb.TempDir(), port: server.RANDOM_PORT}
	srv, err := s.start()
	if err != nil {
		tb.Fatalf("natstest: %v", err)
	}
	s.srv = srv
	tb.Cleanup(s.Shutdown)
	return s
}

// options builds the options of one start: the test defaults, then the
// Options in order, then the port the first start picked.
func (s *Server) options() *server.Options {
	o := &server.Options{
		ServerName: "natstest",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   s.storeDir,
		NoLog:      true,
		NoSigs:     true,
	}
	for _, opt := range s.opts {
		opt(o)
	}
	if s.port != server.RANDOM_PORT {
		// The first start picked the port: Restart comes back where the
		// clients look for it.
		o.Port = s.port
	}
	return o
}

// start builds and starts a server and waits until it accepts connections.
// It pins the port the server listens on.
func (s *Server) start() (*server.Server, error) {
	o := s.options()
	srv, err := server.NewServer(o)
	if err != nil {
		return nil, fmt.Errorf("new server: %w", err)
	}
	if !o.NoLog {
		srv.ConfigureLogger()
	}
	srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("server not ready for connections")
	}
	if addr, ok := srv.Addr().(*net.TCPAddr); ok {
		s.host, s.port = o.Host, addr.Port
	}
	s.storeDir = o.StoreDir
	return srv, nil
}

// URL is the client URL, e.g. nats://127.0.0.1:41234. It stays the same
// across restarts.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("nats://%s:%d", s.host, s.port)
}

// StoreDir is the JetStream store directory.
func (s *Server) StoreDir() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storeDir
}

// NATS returns the running server, or nil while it is shut down.
func (s *Server) NATS() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Shutdown stops the server and waits until it has stopped. Clients see a
// disconnect and try to reconnect. It is safe to call more than once.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdownLocked()
}

func (s *Server) shutdownLocked() {
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart shuts the server down (if it is running) and starts it again on the
// same port with the same store directory, so clients reconnect and JetStream
// data survives. It fails the test if the server cannot come back.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdownLocked()
	// The port was just released; another process may grab it in between,
	// which is rare enough to retry briefly rather than handle otherwise.
	var err error
	for range 50 {
		var srv *server.Server
		if srv, err = s.start(); err == nil {
			s.srv = srv
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("natstest: restart on port %d: %v", s.port, err)
}

// RestartWithoutStore is Restart with a fresh, empty JetStream store, as a
// server that lost its disk comes back: every stream, the registry bucket
// included, is gone. (A WithStoreDir option still picks the directory.)
func (s *Server) RestartWithoutStore(tb testing.TB) {
	tb.Helper()
	dir := tb.TempDir()
	s.mu.Lock()
	s.storeDir = dir
	s.mu.Unlock()
	s.Restart(tb)
}

// CopyStore stops the server, copies its JetStream store to a directory
// of the test's, and starts it again on it (clients see a disconnect and
// reconnect): the copy is the store as of now, which RestartWithStore
// brings back later, as a server that lost its latest writes (a power
// loss before they reached the disk) comes back.
func (s *Server) CopyStore(tb testing.TB) string {
	tb.Helper()
	s.Shutdown()
	dir := s.copyStore(tb)
	s.Restart(tb)
	return dir
}

// RestartWithStore is Restart over a copy of dir, a store CopyStore
// returned: every stream comes back as it was then, with the same
// identity (its creation time) and its later writes lost, so that its
// sequences, and the registry's revisions, go back.
func (s *Server) RestartWithStore(tb testing.TB, dir string) {
	tb.Helper()
	s.Shutdown()
	s.useStoreCopy(tb, dir)
	s.Restart(tb)
}

// copyStore copies the store of the server, shut down, to a directory of
// the test's and returns it.
func (s *Server) copyStore(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.CopyFS(dir, os.DirFS(s.StoreDir())); err != nil {
		tb.Fatalf("natstest: copy the store: %v", err)
	}
	return dir
}

// useStoreCopy makes a copy of dir the store of the server, shut down, at
// its next start.
func (s *Server) useStoreCopy(tb testing.TB, dir string) {
	tb.Helper()
	fresh := tb.TempDir()
	if err := os.CopyFS(fresh, os.DirFS(dir)); err != nil {
		tb.Fatalf("natstest: copy the store: %v", err)
	}
	s.mu.Lock()
	s.storeDir = fresh
	s.mu.Unlock()
}

// Connect connects a client to the server and closes it in tb.Cleanup. The
// defaults suit tests: reconnect forever, every 20 ms without jitter. opts
// are applied after them and may override them.
func (s *Server) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, s.URL(), opts)
}

// connect connects to url with the test defaults, then opts, and closes
// the connection in tb.Cleanup.
func connect(tb testing.TB, url string, opts []nats.Option) *nats.Conn {
	tb.Helper()
	all := append([]nats.Option{
		nats.Name(tb.Name()),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		tb.Fatalf("natstest: connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// NumClientsExcept returns the number of client connections open on the
// server whose name is none of names: a test that counts its own
// connections leaves out the short-lived ones a component opens by itself
// (subscriber.AdvisoryCheckName).
func (s *Server) NumClientsExcept(tb testing.TB, names ...string) int {
	tb.Helper()
	cz, err := s.NATS().Connz(&server.ConnzOptions{Limit: 1 << 20})
	if err != nil {
		tb.Fatalf("natstest: connz: %v", err)
	}
	n := 0
	for _, c := range cz.Conns {
		if !slices.Contains(names, c.Name) {
			n++
		}
	}
	return n
}
