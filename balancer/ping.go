package balancer

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// A Pinger tells whether a server is alive. Ping is called from the ping
// loop's goroutines, concurrently for different servers; it must honour ctx.
type Pinger interface {
	Ping(ctx context.Context, s *Server) bool
}

// NoOpPing treats every server as alive (Ribbon's DummyPing / NoOpPing).
// With it, a balancer runs no ping loop at all.
type NoOpPing struct{}

// Ping implements Pinger.
func (NoOpPing) Ping(context.Context, *Server) bool { return true }

func isNoOpPing(p Pinger) bool {
	_, ok := p.(NoOpPing)
	return ok
}

// HTTPPing sends GET <scheme>://<addr><Path> and treats a 2xx answer as
// alive (Ribbon's PingUrl).
type HTTPPing struct {
	Path   string
	Client *http.Client
}

// NewHTTPPing returns an HTTPPing for path with its own client and timeout.
func NewHTTPPing(path string, timeout time.Duration) *HTTPPing {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return &HTTPPing{Path: path, Client: &http.Client{Timeout: timeout}}
}

// Ping implements Pinger.
func (p *HTTPPing) Ping(ctx context.Context, s *Server) bool {
	u := url.URL{Scheme: s.URLScheme(), Host: s.Addr(), Path: p.Path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false
	}
	client := p.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// pingParallelism bounds the pings in flight in one round.
const pingParallelism = 16

// pingLoop pings every listed server each interval, and at once after a
// list change, then applies the results in one snapshot rebuild.
type pingLoop struct {
	b        *Balancer
	p        Pinger
	interval time.Duration
	kickc    chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}
}

// startPingLoop starts the loop with ctx, which must not be cancelled but
// by stop.
func startPingLoop(ctx context.Context, b *Balancer, p Pinger, interval time.Duration) *pingLoop {
	ctx, cancel := context.WithCancel(ctx)
	l := &pingLoop{b: b, p: p, interval: interval, kickc: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go l.run(ctx)
	l.kick()
	return l
}

// kick asks for a ping round as soon as possible; it never blocks.
func (l *pingLoop) kick() {
	select {
	case l.kickc <- struct{}{}:
	default:
	}
}

func (l *pingLoop) stop() {
	l.cancel()
	<-l.done
}

func (l *pingLoop) run(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-l.kickc:
		}
		l.round(ctx)
	}
}

// round pings a copy of the list; results for servers that left meanwhile
// are ignored by setAlive.
func (l *pingLoop) round(ctx context.Context) {
	servers := l.b.snap.Load().all
	if len(servers) == 0 {
		return
	}
	results := make(map[string]bool, len(servers))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, pingParallelism)
	for _, s := range servers {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			alive := l.p.Ping(ctx, s)
			mu.Lock()
			results[s.ID] = alive
			mu.Unlock()
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // stopping: a cancelled ping says nothing about the server
	}
	l.b.setAlive(results)
}

var (
	_ Pinger = NoOpPing{}
	_ Pinger = (*HTTPPing)(nil)
)
