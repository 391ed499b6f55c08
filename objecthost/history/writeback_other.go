//go:build !linux

package history

import "os"

// startWriteback is a no-op where sync_file_range does not exist: the
// fsync before a WAL restart writes everything.
func startWriteback(f *os.File, off, n int64) {}

// fileLinks: not known here; Reopen then relies on its other checks.
func fileLinks(fi os.FileInfo) uint64 { return 0 }
