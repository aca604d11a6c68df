package lbhttp

import (
	"io"
	"net/http"
	"testing"

	"github.com/pushlb/pushlb/balancer"
)

// TestStreamingResponseStaysActive: a response's request counts as active
// until its body is read to the end or closed, so long streams are load.
func TestStreamingResponseStaysActive(t *testing.T) {
	release := make(chan struct{})
	be := newBackend(t, "s", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		if r.URL.Path == "/stream" {
			<-release
		}
		io.WriteString(w, "rest\n")
	})
	b := newBalancer(t, "svc", balancer.DefaultConfig(), []balancer.Server{be.server("")})
	tr := newTestTransport(t, BalancerMap{"svc": b})
	st := b.ServerStats("s")

	req, _ := http.NewRequest("GET", "http://svc/stream", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.ActiveRequests(); n != 1 {
		t.Fatalf("while the body streams, active = %d, want 1", n)
	}
	if _, ok := st.ResponseTime(); !ok {
		t.Fatal("the response time is recorded at the headers")
	}
	close(release)
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "first\nrest\n" {
		t.Fatalf("body %q, %v", b, err)
	}
	if n := st.ActiveRequests(); n != 0 {
		t.Fatalf("after EOF, active = %d, want 0", n)
	}
	resp.Body.Close() // a second end does not go below zero
	if n := st.ActiveRequests(); n != 0 {
		t.Fatalf("after Close, active = %d", n)
	}

	// Closed without reading: ended too.
	req, _ = http.NewRequest("GET", "http://svc/short", nil)
	resp, err = tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := st.ActiveRequests(); n != 0 {
		t.Fatalf("after an early Close, active = %d, want 0", n)
	}
}
