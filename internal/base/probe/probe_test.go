package probe_test

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/pushlb/pushlb/internal/base/probe"
)

// An address that accepts answers every connect; a closed one refuses the
// first.
func TestAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := probe.Answers(t.Context(), addr, probe.DefaultTimeout); err != nil {
		t.Fatalf("a listener: %v", err)
	}
	ln.Close()
	if err := probe.Answers(t.Context(), addr, probe.DefaultTimeout); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a closed port: %v, want connection refused", err)
	}
}

// A listener gone after the first connect is found in the confirming
// connects: refused, not alive.
func TestAnswersSeesTheListenerGo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
		ln.Close() // after the first connect: the process died
	}()
	if err := probe.Answers(t.Context(), addr, probe.DefaultTimeout); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a listener closed after the first connect: %v, want connection refused", err)
	}
}
