package raftmeta

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// registerModel treats one account's MaxDatabases as a register: writes set
// it, linearizable reads return it.
var registerModel = porcupine.Model{
	Init: func() interface{} { return int64(0) },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		in := input.(regOp)
		if in.write {
			return true, in.value
		}
		return output.(int64) == state.(int64), state
	},
	Equal: func(a, b interface{}) bool { return a.(int64) == b.(int64) },
}

type regOp struct {
	write bool
	value int64
}

// Writers and linearizable readers on every node, the leader killed midway:
// the recorded history must be linearizable (porcupine). Writes that failed
// may or may not have happened, so they stay open until the end of time.
func TestLinearizableReadsAndWritesAcrossLeaderKill(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	ctx := context.Background()
	setup, err := NewClient(tc.addrs())
	require.NoError(t, err)
	_, err = setup.CreateAccount(ctx, newAccount("reg", 0))
	require.NoError(t, err)

	var (
		mu      sync.Mutex
		history []porcupine.Operation
		next    atomic.Int64
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	record := func(op porcupine.Operation) {
		mu.Lock()
		history = append(history, op)
		mu.Unlock()
	}
	addrs := tc.addrs()
	for w := 0; w < 8; w++ {
		// Each worker prefers a different node, so reads exercise the
		// follower read-index path as well as the leader's.
		order := append(append([]string{}, addrs[w%3:]...), addrs[:w%3]...)
		cl, err := NewClient(order, WithCacheTTL(0))
		require.NoError(t, err)
		writer := w%2 == 0
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			for !stop.Load() {
				if writer {
					v := next.Add(1)
					call := now()
					lim := fsm.Limits{MaxDatabases: v}
					_, err := cl.UpdateAccount(ctx, fsm.UpdateAccount{ID: "reg", Limits: &lim})
					ret := now()
					if err != nil {
						ret = math.MaxInt64 // outcome unknown
					}
					record(porcupine.Operation{ClientId: id, Input: regOp{write: true, value: v}, Call: call, Return: ret})
					continue
				}
				call := now()
				a, err := cl.Account(ctx, "reg", LinearizableRead())
				ret := now()
				if err != nil {
					continue // a failed read observed nothing
				}
				record(porcupine.Operation{ClientId: id, Input: regOp{}, Call: call, Output: a.Limits.MaxDatabases, Return: ret})
			}
		}(w)
	}
	time.Sleep(time.Second) // pacing: the clients record history before the failover
	old := tc.waitLeader()
	killedAt := now()
	require.NoError(t, old.Close())
	// Run until operations completed on both sides of the kill (how many
	// depends on the machine's load, e.g. CI under -race: no count is
	// asserted, only that the history spans the failover).
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond) // poll interval: until the history spans the failover
		var afterW, afterR int
		mu.Lock()
		for _, op := range history {
			if op.Call > killedAt && op.Return != math.MaxInt64 {
				if op.Input.(regOp).write {
					afterW++
				} else {
					afterR++
				}
			}
		}
		mu.Unlock()
		if afterW >= 10 && afterR >= 10 {
			break
		}
	}
	stop.Store(true)
	wg.Wait()

	var reads, writes, afterW, afterR int
	for _, op := range history {
		w := op.Input.(regOp).write
		if w {
			writes++
		} else {
			reads++
		}
		if op.Call > killedAt && op.Return != math.MaxInt64 {
			if w {
				afterW++
			} else {
				afterR++
			}
		}
	}
	t.Logf("history: %d writes, %d reads; %d writes and %d reads completed after the leader was killed", writes, reads, afterW, afterR)
	require.Positive(t, afterW, "no write completed after the leader kill")
	require.Positive(t, afterR, "no read completed after the leader kill")
	res := porcupine.CheckOperationsTimeout(registerModel, history, 60*time.Second)
	require.NotEqual(t, porcupine.Illegal, res, "history is not linearizable")
}
