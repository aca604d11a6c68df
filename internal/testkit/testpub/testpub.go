// Package testpub announces test backends the way cmd/announce does, for
// the tests of the packages above the publisher (the public package, the
// gateway, the examples): register in the registry, then publish online.
package testpub

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// Backend starts an httptest server that answers "<name> <path>", closed
// by the test's cleanup.
func Backend(tb testing.TB, name string) *httptest.Server {
	tb.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	tb.Cleanup(s.Close)
	return s
}

// Announce registers and announces backend as an instance of service in
// zone over nc (the default prefix and lease), with the backend's URL as its
// instance ID. The publisher is closed by the test's cleanup.
func Announce(tb testing.TB, nc *nats.Conn, service, zone string, backend *httptest.Server) *publisher.Publisher {
	tb.Helper()
	return AnnounceAddr(tb, nc, service, zone, backend.URL, backend.Listener.Addr().String())
}

// AnnounceAddr registers and announces the instance id of service at addr
// ("host:port", a server of any protocol) in zone over nc, as Announce
// does.
func AnnounceAddr(tb testing.TB, nc *nats.Conn, service, zone, id, addr string) *publisher.Publisher {
	tb.Helper()
	return AnnounceAt(tb, nc, addr, serverlist.Instance{Service: service, InstanceID: id, Zone: zone})
}

// AnnounceAt registers and announces in at addr ("host:port": in's Host
// and Port are set from it) over nc, with a publisher of its own, closed
// at cleanup: for instances with metadata, weights and the rest.
func AnnounceAt(tb testing.TB, nc *nats.Conn, addr string, in serverlist.Instance) *publisher.Publisher {
	tb.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	in.Host = host
	in.Port, _ = strconv.Atoi(port)
	p := New(tb, nc, publisher.Config{})
	if err := p.Announce(tb.Context(), in); err != nil {
		tb.Fatal(err)
	}
	return p
}

// New opens the registry over nc and returns a publisher of cfg on it,
// closed at cleanup.
func New(tb testing.TB, nc *nats.Conn, cfg publisher.Config) *publisher.Publisher {
	tb.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	reg, err := serverlist.Open(tb.Context(), js, serverlist.RegistryConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	p, err := publisher.New(nc, reg, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}
