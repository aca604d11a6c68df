//go:build linux

package main

import "syscall"

// sysProcAttr puts the command in its own process group, so that a Ctrl-C
// at a terminal reaches announce (which withdraws first) and not the
// command directly, and has the kernel send it SIGTERM if announce dies
// without forwarding anything.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
