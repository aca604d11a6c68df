package testutil

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// FreePort returns a port on 127.0.0.1 that is free for both TCP and UDP
// (gossip needs both) and that no other test takes until this one ends.
//
// A port handed to another process (a gateway's -listen, a NATS server's
// -addr) cannot be bound by port 0 and reported back everywhere, and the
// usual answer, binding port 0 and closing it, races: the kernel hands the
// same port to the next socket that asks for any (an outgoing connection's
// local port, another test's port-0 listener), and the process given it
// fails with "address already in use". So where the kernel tells its
// ephemeral range (Linux), FreePort picks below it, where the kernel never
// hands out a port of its own accord, and reserves the port for the
// test's life with a lock file that every test process on the machine
// honours (flock, released when the test ends or its process dies). What
// is left is a process outside the tests binding a fixed port between the
// check and the use. Prefer port 0 wherever the code under test reports
// the port it got.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := reservePort(tb)
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// FreeAddr returns "127.0.0.1:PORT" with a port from FreePort.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
}

// errPortLocked is lockPort's answer for a port another test holds.
var errPortLocked = errors.New("port reserved by another test")

// The range FreePort picks from when the kernel's ephemeral range is
// known: from reservedLow to the range's start (32768 by default).
const reservedLow = 10000

func reservePort(tb testing.TB) (int, error) {
	first, ok := ephemeralStart()
	if !ok || first <= reservedLow+1000 {
		return kernelPort()
	}
	dir := portLockDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	for range 200 {
		port := reservedLow + rand.IntN(first-reservedLow)
		release, err := lockPort(dir, port)
		if err != nil {
			if errors.Is(err, errPortLocked) {
				continue
			}
			return 0, fmt.Errorf("free port: %w", err)
		}
		if !bindable(port) {
			release()
			continue
		}
		tb.Cleanup(release)
		return port, nil
	}
	return 0, fmt.Errorf("free port: no port in [%d, %d) free for both TCP and UDP on 127.0.0.1", reservedLow, first)
}

// portLockDir is where the ports' lock files live: one directory per
// user, whose test processes are the ones that share ports.
func portLockDir() string {
	return filepath.Join(os.TempDir(), "pushlb-test-ports-"+strconv.Itoa(os.Getuid()))
}

// kernelPort is the fallback where the ephemeral range is unknown: a port
// the kernel picked, free a moment ago.
func kernelPort() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if bindable(port) {
			return port, nil
		}
	}
	return 0, errors.New("free port: no port free for both TCP and UDP on 127.0.0.1")
}

// bindable reports whether port can be bound on 127.0.0.1 for TCP and UDP.
func bindable(port int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// ephemeralStart returns the first port of the kernel's ephemeral range.
func ephemeralStart() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, false
	}
	first, err := strconv.Atoi(fields[0])
	return first, err == nil
}
