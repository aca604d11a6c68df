package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Stream limits and pacing.
const (
	// maxStreams bounds the /-/lb/events streams served at once.
	maxStreams = 64
	// streamBuffer is the number of updates a stream may fall behind
	// before it is dropped: a slow client never blocks the gateway.
	streamBuffer = 32
	// heartbeatInterval is how often an idle stream gets a comment, so
	// that proxies and the browser see it alive.
	heartbeatInterval = 15 * time.Second
	// streamWriteTimeout bounds one write to a stream: a client that
	// stopped reading is cut off rather than held.
	streamWriteTimeout = 10 * time.Second
)

// stream is one /-/lb/events client.
type stream struct {
	ch      chan []byte
	dropped chan struct{}
	once    sync.Once
}

func (s *stream) drop() { s.once.Do(func() { close(s.dropped) }) }

// subscribe adds a stream, or returns nil at the limit or after stop.
func (d *dashboard) subscribe() *stream {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.shutdown || len(d.streams) >= d.maxStreams {
		return nil
	}
	s := &stream{ch: make(chan []byte, streamBuffer), dropped: make(chan struct{})}
	d.streams[s] = struct{}{}
	d.nstreams.Store(int32(len(d.streams)))
	return s
}

func (d *dashboard) unsubscribe(s *stream) {
	d.mu.Lock()
	delete(d.streams, s)
	d.nstreams.Store(int32(len(d.streams)))
	d.mu.Unlock()
}

// broadcast queues msg on every stream; a stream whose buffer is full is
// dropped (its handler returns, the browser reconnects and gets the whole
// state again).
func (d *dashboard) broadcast(msg []byte) {
	d.mu.Lock()
	streams := make([]*stream, 0, len(d.streams))
	for s := range d.streams {
		streams = append(streams, s)
	}
	d.mu.Unlock()
	for _, s := range streams {
		select {
		case s.ch <- msg:
		default:
			d.unsubscribe(s)
			s.drop()
		}
	}
}

// sseMessage encodes one server-sent event.
func sseMessage(event string, v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		data = []byte(fmt.Sprintf("%q", err.Error()))
	}
	var b bytes.Buffer
	b.Grow(len(data) + len(event) + 16)
	fmt.Fprintf(&b, "event: %s\ndata: ", event)
	b.Write(data)
	b.WriteString("\n\n")
	return b.Bytes()
}

// serveEvents is GET /-/lb/events: a text/event-stream that starts with
// the whole state ("state"; with summaries beyond summarizeOver instances),
// then pushes "update" events (changed
// services, new timeline entries) at most 4 times a second, and a comment
// every heartbeat.
func (d *dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	s := d.subscribe()
	if s == nil {
		http.Error(w, "too many /-/lb/events streams, or shutting down", http.StatusServiceUnavailable)
		return
	}
	defer d.unsubscribe(s)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	write := func(b []byte) bool {
		rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// Subscribed before the state is read, so no change falls in between.
	if !write(append([]byte("retry: 1000\n\n"), sseMessage("state", d.firstState())...)) {
		return
	}
	hb := time.NewTicker(d.heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-d.done:
			return
		case <-s.dropped:
			return
		case msg := <-s.ch:
			if !write(msg) {
				return
			}
		case <-hb.C:
			if !write([]byte(": heartbeat\n\n")) {
				return
			}
		}
	}
}
