//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package lbhttp

import (
	"errors"
	"net"
	"syscall"
)

// canPeekIdle: connIdle can look at a socket here, so WithInlineHTTP1 is
// in effect.
const canPeekIdle = true

// connIdle reports whether an idle connection may carry a request: the
// server has neither closed it nor sent anything unasked. A non-blocking
// peek at the socket (one system call, nothing consumed) tells: no data
// (EAGAIN) is the only good answer; end of stream means the server closed
// it, and bytes mean it answered something no request asked for, which
// must never be read as the next response.
func connIdle(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	idle := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		idle = errors.Is(rerr, syscall.EAGAIN)
		return true
	})
	return err == nil && idle
}
