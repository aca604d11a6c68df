// Command fastlb is a measurement, not a product: an HTTP/1.1 reverse proxy
// built on github.com/valyala/fasthttp that picks upstreams with pushlb's
// real balancer, so that bench/gateway.sh can show what a different HTTP
// engine behind pushlb's picks would give against nginx, caddy and the
// net/http gateway (issue 11).
//
//	fastlb -listen 127.0.0.1:19107 -upstream bench=127.0.0.1:19101[,bench=host:port,orders=host:port...]
//
// It routes "/<service>/<rest>" to "/<rest>" on one server of <service>,
// as the gateway does, with one balancer.Balancer per service
// (balancer.DefaultConfig: the ZoneAvoidance rule, its breaker and
// timeouts) over the static list of -upstream. Per request it does what
// the gateway's data plane does around the engine: a Pick, the request
// forwarded on the handler's goroutine through one fasthttp.HostClient per
// server (keep-alive, pooled connections, no per-connection reader or
// writer goroutines), X-Real-IP and X-Forwarded-* set from the connection,
// hop-by-hop headers dropped, and the outcome reported through the pick's
// Done (a connection failure feeds the server's breaker).
//
// What it leaves out, on purpose: no retry on another server, no registry
// (NATS), no metrics, no admin listener, no HTTP/2, no upgrades
// (WebSocket), and bodies are buffered whole in both directions (fasthttp's
// client reads a response entirely before the handler writes it).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/pushlb/pushlb/balancer"
	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:19107", "`address` to serve on")
	upstream := flag.String("upstream", "", "static servers, `name=host:port,...` (a name may repeat)")
	flag.Parse()
	p, err := newProxy(*upstream)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fastlb:", err)
		os.Exit(2)
	}
	srv := &fasthttp.Server{
		Handler:               p.serve,
		Name:                  "fastlb",
		NoDefaultServerHeader: true,
	}
	if err := srv.ListenAndServe(*listen); err != nil {
		fmt.Fprintln(os.Stderr, "fastlb:", err)
		os.Exit(1)
	}
}

// service is one service's balancer and a client per server ID.
type service struct {
	name    string
	prefix  string // "/name"
	b       *balancer.Balancer
	clients map[string]*fasthttp.HostClient
}

type proxy struct {
	services map[string]*service
}

func newProxy(spec string) (*proxy, error) {
	lists := map[string][]balancer.Server{}
	for _, item := range strings.Split(spec, ",") {
		name, addr, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("-upstream: %q is not name=host:port", item)
		}
		s, err := balancer.ParseServer(addr)
		if err != nil {
			return nil, fmt.Errorf("-upstream: %w", err)
		}
		lists[name] = append(lists[name], s)
	}
	cfg := balancer.DefaultConfig()
	p := &proxy{services: map[string]*service{}}
	for name, list := range lists {
		b, err := balancer.New(name, cfg)
		if err != nil {
			return nil, err
		}
		if err := b.SetServers(list); err != nil {
			return nil, err
		}
		svc := &service{name: name, prefix: "/" + name, b: b, clients: map[string]*fasthttp.HostClient{}}
		for _, s := range b.AllServers() {
			svc.clients[s.ID] = &fasthttp.HostClient{
				Addr: s.Addr(),
				Dial: func(addr string) (net.Conn, error) {
					return fasthttp.DialTimeout(addr, cfg.ConnectTimeout)
				},
				ReadTimeout:                   cfg.ReadTimeout,
				NoDefaultUserAgentHeader:      true,
				DisableHeaderNamesNormalizing: true,
				DisablePathNormalizing:        true,
			}
		}
		p.services[name] = svc
	}
	return p, nil
}

// hopHeaders are dropped in both directions (RFC 9110, 7.6.1), as
// httputil.ReverseProxy does.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func (p *proxy) serve(ctx *fasthttp.RequestCtx) {
	// The path is fasthttp's normalised one (dot-segments removed, //
	// merged): "/<service>/<rest>".
	path := ctx.Path()
	name, rest := path[1:], []byte("/")
	if i := bytes.IndexByte(name, '/'); i >= 0 {
		name, rest = name[:i], name[i:]
	}
	svc := p.services[string(name)] // a map lookup by string([]byte) does not allocate
	if svc == nil {
		ctx.Error("unknown service\n", fasthttp.StatusNotFound)
		return
	}
	pick, err := svc.b.Pick(context.Background())
	if err != nil {
		ctx.Error("no servers\n", fasthttp.StatusServiceUnavailable)
		return
	}
	hc := svc.clients[pick.Server.ID]

	req := &ctx.Request
	h := &req.Header
	for _, k := range hopHeaders {
		h.Del(k)
	}
	h.ResetConnectionClose() // the client's Connection: close is the server's business
	h.Del("Forwarded")
	var buf [64]byte
	ip := ctx.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().AppendTo(buf[:0])
	h.SetBytesV("X-Real-IP", ip)
	h.SetBytesV("X-Forwarded-For", ip)
	h.SetBytesV("X-Forwarded-Host", h.Host())
	h.Set("X-Forwarded-Proto", "http")
	h.Set("X-Forwarded-Prefix", svc.prefix)
	req.URI().SetPathBytes(rest)
	req.SetHost(hc.Addr)

	resp := &ctx.Response
	if err := hc.Do(req, resp); err != nil {
		var op *net.OpError
		connect := errors.Is(err, fasthttp.ErrDialTimeout) || (errors.As(err, &op) && op.Op == "dial")
		pick.Done(balancer.DoneInfo{Err: err, ConnectFailure: connect})
		resp.Reset()
		if errors.Is(err, fasthttp.ErrTimeout) {
			ctx.Error("upstream timeout\n", fasthttp.StatusGatewayTimeout)
		} else {
			ctx.Error("bad gateway\n", fasthttp.StatusBadGateway)
		}
		return
	}
	pick.Done(balancer.DoneInfo{})
	for _, k := range hopHeaders {
		resp.Header.Del(k)
	}
	resp.Header.ResetConnectionClose() // the upstream's close is the client's business
}
