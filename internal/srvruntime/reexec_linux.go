package srvruntime

import (
	"os"
	"syscall"
)

// reexec replaces the process with the same binary file (even if it was
// replaced or removed on disk since) and arguments, with env.
func reexec(env []string) error {
	return syscall.Exec("/proc/self/exe", os.Args, env)
}
