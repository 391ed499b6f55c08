package chlocal

import "syscall"

// sysProcAttr puts the server in its own process group (so Close can
// signal everything it started) and has the kernel kill it if the thread
// that started it dies (Start keeps that thread locked for the child's
// lifetime, so this means: if this process dies).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
