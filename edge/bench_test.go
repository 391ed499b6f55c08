package edge

import (
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkRouteCacheHit is the bbolt hit cost on the query path.
func BenchmarkRouteCacheHit(b *testing.B) {
	rc, err := OpenRouteCache(filepath.Join(b.TempDir(), "r.db"), RouteCacheOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	var ids []string
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("%08d-2222-4333-8444-555555555555", i)
		ids = append(ids, id)
		if _, err := rc.Put(Route{DatabaseUUID: id, ObjectID: "0123456789abcdef0123456789abcdef", HostAddress: "127.0.0.1:7001",
			AccountID: "0123456789abcdef0123456789abcdef", State: "active", Generation: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, res := rc.Get(ids[i%len(ids)]); res != cacheHit {
				b.Fatal("miss")
			}
			i++
		}
	})
}
