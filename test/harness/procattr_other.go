//go:build unix && !linux

package harness

import "syscall"

// ChildProcAttr puts a child process in its own process group (the test
// signals the group: kill -9, SIGSTOP, SIGCONT).
func ChildProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
