package fsm

import (
	"encoding/binary"
	"hash/fnv"
	"testing"
)

// TestDigestHashIsFNV1a pins the digest functions to their definition (FNV-1a
// 64 and splitmix64's finaliser): hosts and catalogs of different builds must
// compute the same values, or every bucket differs.
func TestDigestHashIsFNV1a(t *testing.T) {
	h := fnv.New64a()
	h.Write([]byte("bucket\x00"))
	h.Write([]byte("abc"))
	if got, want := DigestBucket("abc"), int(mix64(h.Sum64())%DigestBuckets); got != want {
		t.Fatalf("bucket %d want %d", got, want)
	}
	h = fnv.New64a()
	h.Write([]byte("u"))
	h.Write([]byte{0})
	h.Write([]byte("o"))
	var g [9]byte
	binary.BigEndian.PutUint64(g[1:], 7)
	h.Write(g[:])
	if got, want := DigestOf("u", "o", 7), int64(mix64(h.Sum64())&digestMask); got != want {
		t.Fatalf("digest %d want %d", got, want)
	}
}
