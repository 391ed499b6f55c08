//go:build !unix

package fsm

// allocChunk returns n bytes from the Go heap (no anonymous mappings on
// this OS); see arena_unix.go.
func allocChunk(n int) (b []byte, offHeap bool) { return make([]byte, n), false }

func freeChunk([]byte, bool) {}
