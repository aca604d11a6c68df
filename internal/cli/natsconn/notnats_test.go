package natsconn_test

import (
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/cli/natsconn"
)

// -nats pointed at an HTTP port (a gateway's proxy or admin listener, NATS
// monitoring) fails at once, saying it is an HTTP server, instead of
// retrying until the timeout and reporting "i/o timeout".
func TestHTTPPortIsNotNATS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		srv  *httptest.Server
	}{
		{"http", httptest.NewUnstartedServer(http.NotFoundHandler())},
		{"https", httptest.NewUnstartedServer(http.NotFoundHandler())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the probe's plain request to the HTTPS server
			if tc.name == "https" {
				tc.srv.StartTLS()
			} else {
				tc.srv.Start()
			}
			t.Cleanup(tc.srv.Close)
			addr := tc.srv.Listener.Addr().String()
			began := time.Now()
			_, retries, err := connectLogged(t.Context(), natsconn.Config{URL: "nats://" + addr, ConnectTimeout: 30 * time.Second})
			took := time.Since(began)
			if !errors.Is(err, natsconn.ErrNotNATS) {
				t.Fatalf("error %v, want ErrNotNATS", err)
			}
			if msg := err.Error(); !strings.Contains(msg, addr+" is an HTTP server") || !strings.Contains(msg, "HTTP/1.") {
				t.Fatalf("message %q", msg)
			}
			// One attempt (its read waits up to 2 s for INFO) and the probe,
			// not the 30 s of retries.
			if retries != 0 {
				t.Fatalf("gave up after %d retries, want the first attempt's probe", retries)
			}
			t.Logf("gave up after %v", took)
		})
	}
}

// A server whose first line is not INFO is not a NATS server: said at once.
func TestFirstLineNotINFOIsNotNATS(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
			c.Close()
		}
	}()
	_, retries, err := connectLogged(t.Context(), natsconn.Config{URL: ln.Addr().String(), ConnectTimeout: 30 * time.Second})
	if !errors.Is(err, natsconn.ErrNotNATS) || !strings.Contains(err.Error(), "first line is not NATS's INFO") || retries != 0 {
		t.Fatalf("error %v after %d retries, want ErrNotNATS at once", err, retries)
	}
}

// A server that accepts connections and says nothing, HTTP or not, is
// retried (a busy NATS server could be slow), and the final error says
// what was seen.
func TestSilentServerIsNamedWhenGivingUp(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); close(done) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { <-done; c.Close() }()
		}
	}()
	addr := ln.Addr().String()
	_, err = natsconn.Connect(t.Context(), natsconn.Config{URL: addr, ConnectTimeout: 300 * time.Millisecond}, zerolog.Nop())
	if !errors.Is(err, natsconn.ErrUnreachable) || errors.Is(err, natsconn.ErrNotNATS) ||
		!strings.Contains(err.Error(), addr+" accepts connections but sends no INFO") {
		t.Fatalf("error %v", err)
	}
}
