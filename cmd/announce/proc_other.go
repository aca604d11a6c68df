//go:build !unix

package main

import (
	"os"
	"syscall"
)

// forwardedSignals is empty: only Unix has signals worth forwarding.
var forwardedSignals []os.Signal

// sysProcAttr keeps the defaults.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalProcess sends s to p. Outside Unix only os.Kill can be delivered,
// so a stop signal kills the command.
func signalProcess(p *os.Process, s os.Signal) error {
	if err := p.Signal(s); err != nil {
		return p.Kill()
	}
	return nil
}

// exitStatus is the command's exit code.
func exitStatus(st *os.ProcessState) int { return st.ExitCode() }
