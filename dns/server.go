package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/rs/zerolog"
)

// Server is an authoritative DNS responder over a Source, on UDP and TCP.
// Build it with New, run it with Start, stop it with Close.
type Server struct {
	src Source
	cfg Config
	ttl uint32
	log zerolog.Logger

	rotation atomic.Uint64 // where the next answer's rotation starts
	udpSlots chan struct{} // a token per UDP query being read or answered
	stats    counters

	mu      sync.Mutex // guards the fields below
	state   int        // 0 new, 1 started, 2 closed
	udp     *mdns.Server
	tcp     *mdns.Server
	udpConn net.PacketConn
	tcpLn   net.Listener
	serving sync.WaitGroup // the two serve loops
}

// New builds a responder over src with cfg (the zero Config is the
// default one). It binds nothing and starts nothing. Errors wrap
// ErrInvalidConfig and name every bad field.
func New(src Source, cfg Config) (*Server, error) {
	if src == nil {
		return nil, fmt.Errorf("%w: nil Source", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{src: src, cfg: cfg, ttl: uint32(cfg.TTL / time.Second), log: zerolog.Nop()}
	if cfg.Logger != nil {
		s.log = *cfg.Logger
	}
	s.udpSlots = make(chan struct{}, cfg.MaxConcurrent)
	return s, nil
}

// Start binds UDP and TCP on Config.Addr, the same port for both (with
// port 0, one the system picks free for both), and serves until Close. It
// returns once both listen; ctx bounds the binding only.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case 1:
		return ErrStarted
	case 2:
		return ErrClosed
	}
	pc, ln, err := listen(ctx, s.cfg.Addr)
	if err != nil {
		return err
	}
	s.udpConn, s.tcpLn = pc, &limitListener{Listener: ln, slots: make(chan struct{}, s.cfg.MaxTCPConns)}
	s.udp = &mdns.Server{
		PacketConn: pc,
		UDPSize:    mdns.DefaultMsgSize,
		Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
			defer s.release()
			s.serve(w, r, false)
		}),
		DecorateReader: func(r mdns.Reader) mdns.Reader { return &slotReader{Reader: r, s: s} },
		MsgAcceptFunc: func(h mdns.Header) mdns.MsgAcceptAction {
			a := mdns.DefaultMsgAcceptFunc(h)
			if a != mdns.MsgAccept {
				s.stats.malformed.Add(1)
				s.release() // no handler runs
			}
			return a
		},
		MsgInvalidFunc: func([]byte, error) {
			s.stats.malformed.Add(1)
			s.release() // no handler runs
		},
	}
	s.tcp = &mdns.Server{
		Listener:    s.tcpLn,
		Handler:     mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) { s.serve(w, r, true) }),
		IdleTimeout: func() time.Duration { return 5 * time.Second },
		MsgAcceptFunc: func(h mdns.Header) mdns.MsgAcceptAction {
			a := mdns.DefaultMsgAcceptFunc(h)
			if a != mdns.MsgAccept {
				s.stats.malformed.Add(1)
			}
			return a
		},
		MsgInvalidFunc: func([]byte, error) { s.stats.malformed.Add(1) },
	}
	// Each serve loop says when it runs, or that it ended at once.
	started := make(chan error, 4)
	for _, srv := range []*mdns.Server{s.udp, s.tcp} {
		srv.NotifyStartedFunc = func() { started <- nil }
		s.serving.Go(func() {
			if err := srv.ActivateAndServe(); err != nil {
				s.log.Error().Err(err).Str("addr", s.cfg.Addr).Msg("dns: serving stopped")
				started <- fmt.Errorf("dns: serve: %w", err)
			}
		})
	}
	var errs []error
	for range 2 {
		if err := <-started; err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		s.state = 1 // for Close
		s.mu.Unlock()
		s.Close(ctx)
		s.mu.Lock()
		return errors.Join(errs...)
	}
	s.state = 1
	s.log.Info().Str("dns", s.Addr()).Str("domain", s.cfg.Domain).Dur("ttl", s.cfg.TTL).Msg("dns responder started")
	return nil
}

// listen binds UDP and TCP on addr, the same port for both.
func listen(ctx context.Context, addr string) (net.PacketConn, net.Listener, error) {
	var lc net.ListenConfig
	host, port, _ := net.SplitHostPort(addr) // checked by New
	for try := 0; ; try++ {
		pc, err := lc.ListenPacket(ctx, "udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("dns: listen udp %s: %w", addr, err)
		}
		bound := strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, bound))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if port != "0" || try == 10 {
			return nil, nil, fmt.Errorf("dns: listen tcp %s: %w", net.JoinHostPort(host, bound), err)
		}
		// The free UDP port is taken for TCP: pick another.
	}
}

// serve answers one query.
func (s *Server) serve(w mdns.ResponseWriter, r *mdns.Msg, tcp bool) {
	s.stats.queries.Add(1)
	ctx := &queryContext{deadline: time.Now().Add(s.cfg.FollowWait)}
	defer ctx.release()
	if err := w.WriteMsg(s.answer(ctx, r, tcp)); err != nil {
		s.stats.writeErrors.Add(1)
	}
}

// queryContext bounds a query's wait by its deadline, and makes the
// timer that enforces it only when something waits (Done): a query
// answered from a list the client holds, the common case, costs no timer.
type queryContext struct {
	deadline time.Time
	once     sync.Once
	ctx      context.Context
	cancel   context.CancelFunc
}

func (q *queryContext) timer() context.Context {
	q.once.Do(func() { q.ctx, q.cancel = context.WithDeadline(context.Background(), q.deadline) })
	if q.ctx == nil {
		return released // asked after the query's end
	}
	return q.ctx
}

// released is the context of a query that ended: done.
var released = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

func (q *queryContext) Deadline() (time.Time, bool) { return q.deadline, true }
func (q *queryContext) Done() <-chan struct{}       { return q.timer().Done() }
func (q *queryContext) Err() error                  { return q.timer().Err() }
func (q *queryContext) Value(any) any               { return nil }

// release stops the timer, if one was made.
func (q *queryContext) release() {
	q.once.Do(func() {}) // none made from now on
	if q.cancel != nil {
		q.cancel()
	}
}

// Addr returns the address the responder listens on (UDP and TCP), or ""
// before Start.
func (s *Server) Addr() string {
	if s.udpConn == nil {
		return ""
	}
	return s.udpConn.LocalAddr().String()
}

// Close stops serving and waits, at most until ctx is done, for the
// answers under way. It is idempotent.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	prev := s.state
	s.state = 2
	s.mu.Unlock()
	if prev != 1 {
		return nil
	}
	var errs []error
	for _, srv := range []*mdns.Server{s.udp, s.tcp} {
		if err := srv.ShutdownContext(ctx); err != nil {
			errs = append(errs, fmt.Errorf("dns: shutdown: %w", err))
		}
	}
	s.serving.Wait()
	s.log.Info().Msg("dns responder stopped")
	return errors.Join(errs...)
}

// release frees the slot of a UDP query answered or dropped.
func (s *Server) release() { <-s.udpSlots }

// slotReader takes a slot before each UDP read, so that a query is read
// only while fewer than MaxConcurrent are being answered; the slot is
// freed when the query is answered or dropped (Server.release), or at
// once when the read fails.
type slotReader struct {
	mdns.Reader
	s *Server
}

func (r *slotReader) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *mdns.SessionUDP, error) {
	r.s.udpSlots <- struct{}{}
	m, sess, err := r.Reader.ReadUDP(conn, timeout)
	if err != nil {
		r.s.release()
	}
	return m, sess, err
}

func (r *slotReader) ReadPacketConn(conn net.PacketConn, timeout time.Duration) ([]byte, net.Addr, error) {
	r.s.udpSlots <- struct{}{}
	m, addr, err := r.Reader.(mdns.PacketConnReader).ReadPacketConn(conn, timeout)
	if err != nil {
		r.s.release()
	}
	return m, addr, err
}

// limitListener accepts a connection only while fewer than cap(slots) are
// open.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

var (
	_ context.Context       = (*queryContext)(nil)
	_ mdns.PacketConnReader = (*slotReader)(nil)
	_ net.Listener          = (*limitListener)(nil)
)
