//go:build unix && !linux

package test

import "syscall"

// childProcAttr puts a child process in its own process group (the test
// signals the group: kill -9, SIGSTOP, SIGCONT).
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
