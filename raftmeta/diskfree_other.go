//go:build !unix

package raftmeta

// diskFree cannot tell the free space on this OS.
func diskFree(string) (uint64, bool) { return 0, false }
