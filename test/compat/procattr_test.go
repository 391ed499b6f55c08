//go:build linux

package compat

import "syscall"

// childProcAttr puts `shoal dev` in its own process group and has the
// kernel kill it if the test binary dies without running its cleanups.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
