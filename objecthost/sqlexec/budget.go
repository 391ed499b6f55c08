package sqlexec

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"sync"

	"golang.org/x/sync/semaphore"
)

var errVFS = errors.New("sqlexec: registering the shoal-excl VFS failed (no unix-excl VFS in the linked SQLite)")

// ResultBudget bounds the bytes of encoded results (Request.Encode) that all
// the requests sharing it hold at once: the object host keeps one, so a
// burst of large answers from many tenants cannot take the process's
// memory, whatever each request's own MaxResultBytes. Each request gets
// FreeBytes without charge (point queries never touch the budget); beyond
// that its ResultLease takes the budget in steps of ChargeStep, without
// waiting: when the budget is spent the request fails at once
// (CodeOverloaded, retryable) rather than queue holding what it has. Safe
// for concurrent use.
type ResultBudget struct {
	sem  *semaphore.Weighted
	free int64
}

// Budget defaults: the first MiB of a request's results is free, the rest
// is charged in MiB steps.
const (
	ResultFreeBytes  = 1 << 20
	ResultChargeStep = 1 << 20
)

// NewResultBudget returns a budget of total bytes.
func NewResultBudget(total int64) *ResultBudget {
	return &ResultBudget{sem: semaphore.NewWeighted(total), free: ResultFreeBytes}
}

// Lease returns an empty lease on b for one request.
func (b *ResultBudget) Lease() *ResultLease { return &ResultLease{b: b} }

// ResultLease is one request's share of a ResultBudget. Grow is called by
// the request's connection (one goroutine), Release by its owner after the
// request returned; Release is idempotent.
type ResultLease struct {
	b    *ResultBudget
	mu   sync.Mutex
	held int64
}

// cover makes the lease cover n bytes of results, taking more of the budget
// if needed; false means the budget cannot.
func (l *ResultLease) cover(n int64) bool {
	if l == nil || n <= l.b.free {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	need := n - l.b.free
	if need <= l.held {
		return true
	}
	step := need - l.held
	step = (step + ResultChargeStep - 1) / ResultChargeStep * ResultChargeStep
	if !l.b.sem.TryAcquire(step) {
		return false
	}
	l.held += step
	return true
}

// Release returns what the lease holds to the budget.
func (l *ResultLease) Release() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held > 0 {
		l.b.sem.Release(l.held)
		l.held = 0
	}
}

// SetTempSpaceLimit caps the bytes of temporary files that every SQLite
// connection of the process may hold open together (0: no cap); each
// request is also capped by its Limits.MaxTempBytes. A write past the cap
// fails its request (SQLITE_FULL, TempHostFullMessage). The cap is
// process-wide because SQLite's VFS is: the object host sets it at Open.
func SetTempSpaceLimit(total int64) {
	registerVFS()
	C.shoal_set_temp_max(C.longlong(total))
}

// TempSpaceInUse is the bytes of temporary files open in the process.
func TempSpaceInUse() int64 { return int64(C.shoal_temp_bytes()) }

// globalConfig reports what shoal_global_config (vfs.c) got from SQLite: 0
// when its process-wide options apply, -1 before it ran, else SQLite's
// code (SQLITE_MISUSE: SQLite was initialized before sqlexec's first
// open, and its defaults stay). memoryUsed is SQLite's heap counter, which
// stays 0 while memory statistics are off.
func globalConfig() int { return int(C.shoal_global_config_rc()) }
func memoryUsed() int64 { return int64(C.sqlite3_memory_used()) }

// registerVFS registers the "shoal-excl" VFS once per process (vfs.c); every
// connection opens through it.
var registerVFS = sync.OnceValue(func() error {
	if rc := C.shoal_vfs_register(); rc != 0 {
		return errVFS
	}
	return nil
})
