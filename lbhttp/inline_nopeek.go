//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package lbhttp

import "net"

// canPeekIdle: connIdle cannot look at a socket on this system, so
// WithInlineHTTP1 has no effect: an idle connection could not be checked
// for bytes the server sent unasked before it carries a request.
const canPeekIdle = false

func connIdle(net.Conn) bool { return false }
