package objecthost

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeConn fails the test if used after Close.
type fakeConn struct {
	id     string
	closed atomic.Bool
	users  atomic.Int32
	t      *testing.T
	// onClose runs on Close (before it returns).
	onClose func()
}

func (c *fakeConn) use() {
	c.users.Add(1)
	if c.closed.Load() {
		c.t.Errorf("use after close of %s", c.id)
	}
	c.users.Add(-1)
}

func (c *fakeConn) Close() error {
	if c.users.Load() != 0 {
		c.t.Errorf("close of %s while in use", c.id)
	}
	if c.closed.Swap(true) {
		c.t.Errorf("double close of %s", c.id)
	}
	if c.onClose != nil {
		c.onClose()
	}
	return nil
}

func TestHandleCacheRefcountAndCap(t *testing.T) {
	var mu sync.Mutex
	live := map[string]int{} // open handles per id: never more than one
	var opened atomic.Int64
	var maxSeen atomic.Int64
	c := newHandleCache(4, func(id string) (*fakeConn, error) {
		mu.Lock()
		live[id]++
		if live[id] > 1 {
			t.Errorf("two live handles for %s", id)
		}
		mu.Unlock()
		opened.Add(1)
		return &fakeConn{id: id, t: t, onClose: func() {
			mu.Lock()
			live[id]--
			mu.Unlock()
		}}, nil
	}, func(n int) {
		if int64(n) > maxSeen.Load() {
			maxSeen.Store(int64(n))
		}
	})
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				id := fmt.Sprintf("db%d", rand.IntN(12))
				h, err := c.acquire(id)
				if !assert.NoError(t, err) {
					return
				}
				h.db.use()
				h.db.use()
				c.release(h)
				if i%50 == 0 {
					<-c.evict(id)
				}
			}
		}()
	}
	wg.Wait()
	// Unpinned: the cache is back within its cap.
	assert.LessOrEqual(t, c.len(), 4)
	// Pinned handles may exceed the cap only by the number of pinners (16).
	assert.LessOrEqual(t, maxSeen.Load(), int64(4+16))
	assert.Greater(t, opened.Load(), int64(12), "evictions forced reopens")
	c.closeEverything()
	assert.Zero(t, c.len())
}

func TestHandleCacheEvictWaitsForPinned(t *testing.T) {
	c := newHandleCache(10, func(id string) (*fakeConn, error) { return &fakeConn{id: id, t: t}, nil }, nil)
	h, err := c.acquire("a")
	require.NoError(t, err)
	done := c.evict("a")
	select {
	case <-done:
		t.Fatal("evict closed a pinned handle")
	default:
	}
	assert.False(t, h.db.closed.Load())
	c.release(h)
	<-done
	assert.True(t, h.db.closed.Load())
	h2, err := c.acquire("a")
	require.NoError(t, err)
	assert.NotSame(t, h, h2, "a fresh handle after eviction")
	c.release(h2)
}

func TestHandleCacheOpenErrorNotCached(t *testing.T) {
	fail := true
	c := newHandleCache(10, func(id string) (*fakeConn, error) {
		if fail {
			return nil, fmt.Errorf("disk full")
		}
		return &fakeConn{id: id, t: t}, nil
	}, nil)
	_, err := c.acquire("a")
	require.Error(t, err)
	assert.Zero(t, c.len())
	fail = false
	h, err := c.acquire("a")
	require.NoError(t, err)
	c.release(h)
}

// TestLRUCapUnderConcurrentQueries runs real queries on more databases than
// the cap from 16 goroutines: every query succeeds (no use-after-close:
// sqlexec would return ErrClosed) and the open handles settle within the cap.
func TestLRUCapUnderConcurrentQueries(t *testing.T) {
	const capN, dbs = 5, 40
	th := newTestHost(t, func(c *Config) { c.MaxOpen = capN })
	ctx := context.Background()
	all := make([]db, dbs)
	for i := range all {
		all[i] = newDB("a")
		th.mustInit(t, all[i])
		_, err := th.Query(ctx, all[i].obj, all[i].id(), q("CREATE TABLE t (x)"))
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	var errs atomic.Int64
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				d := all[rand.IntN(dbs)]
				sql := "SELECT count(*) FROM t"
				if i%3 == 0 {
					sql = "INSERT INTO t VALUES (1)"
				}
				if _, err := th.Query(ctx, d.obj, d.id(), q(sql)); err != nil {
					errs.Add(1)
					t.Log(err)
				}
			}
		}(g)
	}
	wg.Wait()
	assert.Zero(t, errs.Load())
	assert.LessOrEqual(t, th.Stats().OpenHandles, capN)
	var total int64
	for _, d := range all {
		res, err := th.Query(ctx, d.obj, d.id(), q("SELECT count(*) AS n FROM t"))
		require.NoError(t, err)
		rows := res[0].Results
		total += countOf(t, rows)
	}
	assert.EqualValues(t, 16*20, total, "every acknowledged insert is there")
}

// countOf decodes a one-row {"n": int} result.
func countOf(t *testing.T, rows any) int64 {
	b, err := json.Marshal(rows)
	require.NoError(t, err)
	var out []struct{ N int64 }
	require.NoError(t, json.Unmarshal(b, &out))
	require.Len(t, out, 1)
	return out[0].N
}
