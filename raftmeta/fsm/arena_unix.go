//go:build unix

package fsm

import "syscall"

// allocChunk returns n bytes of zeroed memory outside the Go heap (an
// anonymous private mapping) and offHeap=true, or, if the mapping fails,
// heap memory and false. Off the heap, the remembered request IDs neither
// count toward the collector's heap target (GOGC multiplies the live heap,
// and these bytes were most of it) nor cost it anything. freeChunk returns
// the memory; touching it after that faults, which is why chunks are
// reference-counted (see chunk).
func allocChunk(n int) (b []byte, offHeap bool) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]byte, n), false
	}
	return b, true
}

func freeChunk(b []byte, offHeap bool) {
	if offHeap {
		_ = syscall.Munmap(b[:cap(b)])
	}
}
