//go:build unix

package main

import (
	"os"
	"syscall"
)

// forwardedSignals are passed on to the command as they come, without
// withdrawing.
var forwardedSignals = []os.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// signalProcess sends s to the process group of p (announce puts the
// command in a group of its own, whose ID is its PID), so that helpers the
// command started get it as they would from a terminal; if that fails, to p
// alone.
func signalProcess(p *os.Process, s os.Signal) error {
	if sig, ok := s.(syscall.Signal); ok {
		if err := syscall.Kill(-p.Pid, sig); err == nil {
			return nil
		}
	}
	return p.Signal(s)
}

// exitStatus is the status a shell would report: the exit code, or 128+N if
// signal N killed the process.
func exitStatus(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}
