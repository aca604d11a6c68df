package testutil

import (
	"net"
	"strconv"
	"testing"
)

// FreePort returns a port on 127.0.0.1 that was free for both TCP and UDP
// a moment ago (gossip needs both). Another process may take it before the
// caller binds it; prefer port 0 wherever the code under test reports the
// port it got.
func FreePort(tb testing.TB) int {
	tb.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	tb.Fatal("no port free for both TCP and UDP on 127.0.0.1")
	return 0
}

// FreeAddr returns "127.0.0.1:PORT" with a port from FreePort.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
}
