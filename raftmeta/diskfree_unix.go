//go:build unix

package raftmeta

import "syscall"

// diskFree is the space an unprivileged process may still write in the file
// system holding dir (ok false if it cannot be told).
func diskFree(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true //nolint:unconvert // field types differ by OS
}
