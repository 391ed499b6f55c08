package objecthost

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// TenantLimits keep one tenant from taking a host from the others
// (docs/security.md). Each database is already served by one writer and
// ReadConns readers with a bounded queue (sqlexec); these bound an
// account across all its databases on the host, and the host as a whole.
// Zero values take the defaults.
type TenantLimits struct {
	// MaxRunning is how many requests of one account run on this host at
	// once (default 8). Further requests wait, in arrival order, up to
	// MaxWaiting of them (default 128) for at most Wait (default 2 s);
	// beyond that they are refused with 429/7429 and Retry-After. The wait
	// is short so that it and the query (QueryTimeout, 30 s) together stay
	// under the edge's 35 s budget for a host call.
	// Requests wait before their bodies are read.
	MaxRunning int
	MaxWaiting int
	Wait       time.Duration
	// ResultMemory bounds the bytes of query results the host holds at
	// once, all requests together (default 1 GiB; sqlexec.ResultBudget):
	// past it, a request whose results are still growing fails with
	// 429/7501 "short of memory", retryable. Each request's own limit is
	// Limits.MaxResultBytes (D1's 50 MB).
	ResultMemory int64
	// MaxTempBytes bounds the temporary files of every query of the
	// process together (default 4 GiB; each query's own cap is
	// Limits.MaxTempBytes, 512 MiB). The cap is process-wide
	// (sqlexec.SetTempSpaceLimit): the last host opened in a process sets
	// it.
	MaxTempBytes int64
}

func (l *TenantLimits) setDefaults() {
	if l.MaxRunning <= 0 {
		l.MaxRunning = 8
	}
	if l.MaxWaiting <= 0 {
		l.MaxWaiting = 128
	}
	if l.Wait <= 0 {
		l.Wait = 2 * time.Second
	}
	if l.ResultMemory <= 0 {
		l.ResultMemory = 1 << 30
	}
	if l.MaxTempBytes <= 0 {
		l.MaxTempBytes = 4 << 30
	}
}

// errAccountBusy refuses a request of an account that has MaxRunning
// requests running and MaxWaiting waiting on this host (or whose wait ran
// out): 429/7429 with Retry-After.
type errAccountBusy struct{ running, waiting int }

func (e *errAccountBusy) Error() string {
	return fmt.Sprintf("too many concurrent requests for this account on this database host "+
		"(%d running, %d waiting at most); retry later, or send fewer requests at once", e.running, e.waiting)
}

// tenantGuard is the host's per-account admission and its result budget.
type tenantGuard struct {
	lim    TenantLimits
	budget *sqlexec.ResultBudget

	mu    sync.Mutex
	accts map[string]*acctSlot
	// free holds slots of accounts that had nothing running any more, for
	// reuse (at most maxFreeSlots): an account with one request at a time
	// otherwise allocated a slot per request.
	free []*acctSlot

	refused prometheus.Counter
	waited  prometheus.Counter
}

// acctSlot is one account's admission state; it exists while the account
// has requests running or waiting.
type acctSlot struct {
	running int
	waiters []chan struct{} // FIFO; a closed channel hands its waiter a running slot
}

func newTenantGuard(lim TenantLimits, reg prometheus.Registerer) *tenantGuard {
	lim.setDefaults()
	sqlexec.SetTempSpaceLimit(lim.MaxTempBytes)
	g := &tenantGuard{lim: lim, budget: sqlexec.NewResultBudget(lim.ResultMemory), accts: map[string]*acctSlot{},
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_objecthost_account_admission_refused_total",
			Help: "Requests refused because their account had the most requests running and waiting on this host."}),
		waited: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_objecthost_account_admission_waited_total",
			Help: "Requests that waited for one of their account's running slots on this host."}),
	}
	reg.MustRegister(g.refused, g.waited, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "shoal_objecthost_sqlite_temp_bytes", Help: "Bytes of SQLite temporary files open in the process (sorts, temporary b-trees, statement journals).",
	}, func() float64 { return float64(sqlexec.TempSpaceInUse()) }))
	return g
}

// admit waits for a running slot of acct, in arrival order, bounded by
// MaxWaiting, Wait and ctx; the caller must call leave once done.
func (g *tenantGuard) admit(ctx context.Context, acct string) error {
	g.mu.Lock()
	s := g.accts[acct]
	if s == nil {
		if n := len(g.free); n > 0 {
			s = g.free[n-1]
			g.free[n-1] = nil
			g.free = g.free[:n-1]
		} else {
			s = &acctSlot{}
		}
		g.accts[acct] = s
	}
	if s.running < g.lim.MaxRunning && len(s.waiters) == 0 {
		s.running++
		g.mu.Unlock()
		return nil
	}
	if len(s.waiters) >= g.lim.MaxWaiting {
		g.mu.Unlock()
		g.refused.Inc()
		return &errAccountBusy{running: g.lim.MaxRunning, waiting: g.lim.MaxWaiting}
	}
	ch := make(chan struct{})
	s.waiters = append(s.waiters, ch)
	g.mu.Unlock()
	g.waited.Inc()
	t := time.NewTimer(g.lim.Wait)
	defer t.Stop()
	var err error
	select {
	case <-ch:
		return nil
	case <-t.C:
		err = &errAccountBusy{running: g.lim.MaxRunning, waiting: g.lim.MaxWaiting}
	case <-ctx.Done():
		err = ctx.Err()
	}
	g.mu.Lock()
	for i, w := range s.waiters {
		if w == ch {
			s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
			g.mu.Unlock()
			g.refused.Inc()
			return err
		}
	}
	g.mu.Unlock()
	// Handed a slot just as the wait ended: give it on.
	g.leave(acct)
	g.refused.Inc()
	return err
}

// leave ends a request admitted by admit: its slot goes to the account's
// oldest waiter, else is freed.
func (g *tenantGuard) leave(acct string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.accts[acct]
	if s == nil {
		return
	}
	if len(s.waiters) > 0 {
		ch := s.waiters[0]
		s.waiters[0] = nil
		s.waiters = s.waiters[1:]
		close(ch) // the slot passes on: running is unchanged
		return
	}
	s.running--
	if s.running <= 0 {
		delete(g.accts, acct)
		if len(g.free) < maxFreeSlots {
			*s = acctSlot{waiters: s.waiters[:0]}
			g.free = append(g.free, s)
		}
	}
}

// maxFreeSlots bounds tenantGuard.free.
const maxFreeSlots = 64

// isAccountBusy reports whether err is an admission refusal.
func isAccountBusy(err error) bool {
	var b *errAccountBusy
	return errors.As(err, &b)
}
