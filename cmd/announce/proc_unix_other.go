//go:build unix && !linux

package main

import "syscall"

// sysProcAttr puts the command in its own process group, so that a Ctrl-C
// at a terminal reaches announce (which withdraws first) and not the
// command directly.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
