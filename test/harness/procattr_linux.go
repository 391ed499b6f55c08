//go:build linux

package harness

import "syscall"

// ChildProcAttr puts a child process in its own process group (the test
// signals the group: kill -9, SIGSTOP, SIGCONT) and has the kernel kill it
// if the test binary dies without running its cleanups (a -timeout panic).
func ChildProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
