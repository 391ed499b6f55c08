//go:build !linux

package chlocal

import "syscall"

// sysProcAttr puts the server in its own process group. Without Pdeathsig
// (Linux only), a parent killed with SIGKILL leaves the server running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
