package lbhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// The Proxy forwards most requests itself (forward), doing what
// httputil.ReverseProxy does for them step by step, with fewer
// allocations: the outgoing request is a shallow copy with a header map
// sized once instead of a deep clone, the Content-Type is not parsed to
// find event streams, response headers are shared rather than copied value
// by value. The requests it leaves to ReverseProxy (canForward) are the
// rare ones where ReverseProxy does more: protocol upgrades, which it
// tunnels; query strings it would re-encode; contexts without a
// cancellation signal. TestForwardMatchesReverseProxy sends the same
// requests through both and compares what backend and client see.

// leanQueries is false when GODEBUG sets urlmaxqueryparams: ReverseProxy
// then re-encodes every query string, which forward does not do.
var leanQueries = !strings.Contains(os.Getenv("GODEBUG"), "urlmaxqueryparams")

// maxQueryParams is ReverseProxy's limit beyond which it re-encodes a
// query string (net/url's default maximum number of parameters).
const maxQueryParams = 10000

// hopHeaders are the hop-by-hop headers ReverseProxy removes from requests
// and responses, besides those the Connection header lists.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// canForward reports whether forward handles r as ReverseProxy would: no
// protocol upgrade asked, a query string ReverseProxy keeps as it is, and
// a context that ends when the client goes away.
func canForward(r *http.Request) bool {
	if r.Context().Done() == nil || !leanQueries {
		return false
	}
	if _, ok := r.Header["Upgrade"]; ok {
		return false
	}
	return cleanQuery(r.URL.RawQuery)
}

// cleanQuery reports whether ReverseProxy sends the query string q as it
// is: no ';', only valid %-escapes, not too many parameters.
func cleanQuery(q string) bool {
	if q == "" {
		return true
	}
	if strings.Count(q, "&")+1 > maxQueryParams {
		return false
	}
	for i := 0; i < len(q); {
		switch q[i] {
		case ';':
			return false
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return false
			}
			i += 3
		default:
			i++
		}
	}
	return true
}

// forward sends r to its service and copies the answer to w, as
// ReverseProxy.ServeHTTP with the Proxy's Rewrite does for a request
// canForward accepts.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	out := &outgoing{w: w}
	out.trace.Got1xxResponse = out.got1xx
	// WithContext is the shallow copy of the request to send.
	outreq := r.WithContext(httptrace.WithClientTrace(r.Context(), &out.trace))
	if r.ContentLength == 0 {
		outreq.Body = nil
	}
	if outreq.Body != nil {
		// The Transport closes the body it was given; the client's body is
		// the server's to close.
		out.body.rc = r.Body
		outreq.Body = &out.body
		// A Read in flight after the handler returned fails rather than
		// reach the server's body.
		defer out.body.Close()
	}
	out.url = *r.URL
	outreq.URL = &out.url
	if r.URL.User != nil {
		u := *r.URL.User
		out.url.User = &u
	}
	outreq.Header = outgoingHeader(r.Header)
	if r.Trailer != nil {
		outreq.Trailer = r.Trailer.Clone()
	}
	outreq.Close = false
	if headerValuesContainToken(r.Header["Te"], "trailers") {
		outreq.Header.Set("Te", "trailers")
	}
	outreq.Header.Del("Forwarded")
	outreq.Header.Del("X-Forwarded-For")
	outreq.Header.Del("X-Forwarded-Host")
	outreq.Header.Del("X-Forwarded-Proto")
	out.pr = httputil.ProxyRequest{In: r, Out: outreq}
	p.rewrite(&out.pr)
	if _, ok := outreq.Header["User-Agent"]; !ok {
		outreq.Header.Set("User-Agent", "") // no Go default
	}

	res, err := p.rp.Transport.RoundTrip(outreq)
	out.mu.Lock()
	out.done = true
	out.mu.Unlock()
	if err != nil {
		p.handleError(w, outreq, err)
		return
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		// No upgrade was asked: ReverseProxy refuses the switch too.
		res.Body.Close()
		p.handleError(w, outreq, fmt.Errorf("backend tried to switch protocol %q when %q was requested", res.Header.Get("Upgrade"), ""))
		return
	}
	removeHopByHop(res.Header)
	h := w.Header()
	for k, vv := range res.Header {
		if len(h[k]) == 0 {
			h[k] = vv[:len(vv):len(vv)]
		} else {
			h[k] = append(h[k], vv...)
		}
	}
	announced := len(res.Trailer)
	if announced > 0 {
		keys := make([]string, 0, len(res.Trailer))
		for k := range res.Trailer {
			keys = append(keys, k)
		}
		h.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(res.StatusCode)

	if err := p.copyBody(w, res); err != nil {
		defer res.Body.Close()
		if r.Context().Value(http.ServerContextKey) == nil {
			return // not under a server, which would recover the panic
		}
		// Abort the client's response, as ReverseProxy does: its length
		// or end can no longer be right.
		panic(http.ErrAbortHandler)
	}
	res.Body.Close() // now, to read the trailers
	if len(res.Trailer) > 0 {
		// Chunked, so that the trailers can follow.
		http.NewResponseController(w).Flush()
	}
	if len(res.Trailer) == announced {
		for k, vv := range res.Trailer {
			h[k] = append(h[k], vv...)
		}
		return
	}
	for k, vv := range res.Trailer {
		for _, v := range vv {
			h.Add(http.TrailerPrefix+k, v)
		}
	}
}

// outgoing is what forward allocates for one request, in one piece.
type outgoing struct {
	url   url.URL
	body  noCloseBody
	pr    httputil.ProxyRequest
	trace httptrace.ClientTrace

	w    http.ResponseWriter
	mu   sync.Mutex
	done bool // RoundTrip returned: 1xx answers are no longer forwarded
}

// got1xx forwards an informational answer (103 Early Hints) to the client
// while the final one is awaited.
func (o *outgoing) got1xx(code int, header textproto.MIMEHeader) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.done {
		return nil
	}
	h := o.w.Header()
	for k, vv := range header {
		h[k] = append(h[k], vv...)
	}
	o.w.WriteHeader(code)
	clear(h) // WriteHeader does not for 1xx
	return nil
}

// noCloseBody hands the client's body to the Transport without its
// Close, which only stops further reads (ReverseProxy's noopCloseReader).
type noCloseBody struct {
	rc     io.ReadCloser
	closed atomic.Bool
}

func (b *noCloseBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errors.New("lbhttp: read on the closed body of a forwarded request")
	}
	return b.rc.Read(p)
}

func (b *noCloseBody) Close() error {
	b.closed.Store(true)
	return nil
}

// outgoingHeader copies the request's header without its hop-by-hop
// fields, into a map with room for the forwarding headers. The value
// slices are shared, capped so that an Add copies them.
func outgoingHeader(in http.Header) http.Header {
	out := make(http.Header, len(in)+6)
	for k, vv := range in {
		out[k] = vv[:len(vv):len(vv)]
	}
	removeHopByHop(out)
	return out
}

// removeHopByHop removes the headers the Connection header lists and the
// hop-by-hop headers, as ReverseProxy does.
func removeHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = textproto.TrimString(sf); sf != "" {
				h.Del(sf)
			}
		}
	}
	for _, f := range hopHeaders {
		delete(h, f)
	}
}

// headerValuesContainToken reports whether a comma-separated value lists
// token, case-insensitively.
func headerValuesContainToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// copyBody copies the response body to w, flushing after every write when
// the response is a stream (an event stream, or no length), as ReverseProxy
// does; then the headers are flushed at once, before any body arrives.
func (p *Proxy) copyBody(w http.ResponseWriter, res *http.Response) error {
	var flush func() error
	if isEventStream(res.Header.Get("Content-Type")) || res.ContentLength == -1 {
		flush = http.NewResponseController(w).Flush
		flush()
	}
	buf := p.buffers.Get()
	defer p.buffers.Put(buf)
	for {
		nr, rerr := res.Body.Read(buf)
		if rerr != nil && rerr != io.EOF && rerr != context.Canceled {
			p.rp.ErrorLog.Printf("httputil: ReverseProxy read error during body copy: %v", rerr)
		}
		if nr > 0 {
			nw, werr := w.Write(buf[:nr])
			if werr != nil {
				return werr
			}
			if nw != nr {
				return io.ErrShortWrite
			}
			if flush != nil {
				flush()
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// isEventStream reports whether a Content-Type is text/event-stream,
// parameters aside, as mime.ParseMediaType would read it.
func isEventStream(ct string) bool {
	const sse = "text/event-stream"
	if len(ct) < len(sse) || !strings.EqualFold(ct[:len(sse)], sse) {
		return false
	}
	rest := strings.TrimLeft(ct[len(sse):], " \t")
	return rest == "" || rest[0] == ';'
}

var _ io.ReadCloser = (*noCloseBody)(nil)
