//go:build linux

package history

import (
	"os"
	"syscall"
)

// startWriteback asks the kernel to start writing [off, off+n) of f to
// disk now, without waiting for it (sync_file_range with
// SYNC_FILE_RANGE_WRITE, no flush of the device cache): the staging bytes
// then go to disk while the writer works, instead of all at once in the
// fsync before a WAL restart, where they slowed SQLite's own checkpoint
// fsyncs (measured: docs/bench/history.md). A hint only: errors are
// ignored, durability still comes from the fsync.
func startWriteback(f *os.File, off, n int64) {
	const syncFileRangeWrite = 2
	_, _, _ = syscall.Syscall6(syscall.SYS_SYNC_FILE_RANGE, f.Fd(), uintptr(off), uintptr(n), syncFileRangeWrite, 0, 0)
}

// fileLinks reads a file's link count (0 where the platform does not
// say): for a directory, 2 + its subdirectories (Reopen's check that no
// generation directory was added).
func fileLinks(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 0
}
