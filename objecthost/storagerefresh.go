package objecthost

import (
	"context"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// AccountReader is the optional catalog read of one account (limits and
// drained storage total) behind the storage refresh; RaftmetaCatalog
// serves it from a follower through a cache keyed by account.
type AccountReader interface {
	Account(ctx context.Context, id string) (fsm.Account, error)
}

// maxRefreshPerPass bounds the accounts re-read in one pass (a host whose
// every account is near its limit still costs the catalog a bounded rate).
const maxRefreshPerPass = 1000

// RefreshStorage re-reads the storage totals of the accounts near or over
// their storage limit (see Config.StorageRefresh) and applies them as a
// heartbeat would: over the limit blocks growth on every database of the
// account on this host, back under lifts it. It returns how many accounts
// it read. A failed read keeps the last answer.
func (h *Host) RefreshStorage(ctx context.Context) int {
	rd, ok := h.cfg.Catalog.(AccountReader)
	if !ok {
		return 0
	}
	var ids []string
	h.accMu.Lock()
	for id, st := range h.accounts {
		if st.maxStorageBytes > 0 && (st.blockGrowth || float64(st.storageBytes) >= h.cfg.StorageRefreshNear*float64(st.maxStorageBytes)) {
			ids = append(ids, id)
			if len(ids) == maxRefreshPerPass {
				break
			}
		}
	}
	h.accMu.Unlock()
	got := make(map[string]fsm.Account, len(ids))
	for _, id := range ids {
		cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
		a, err := rd.Account(cctx, id)
		cancel()
		if err != nil {
			h.m.catalogCalls.WithLabelValues("account", "error").Inc()
			continue
		}
		h.m.catalogCalls.WithLabelValues("account", "ok").Inc()
		got[id] = a
	}
	h.applyAccounts(got)
	return len(got)
}

func (h *Host) startStorageRefresh(ctx context.Context) {
	if h.cfg.StorageRefresh <= 0 || h.cfg.Catalog == nil {
		return
	}
	if _, ok := h.cfg.Catalog.(AccountReader); !ok {
		return
	}
	h.goEvery(ctx, h.cfg.StorageRefresh, func(ctx context.Context) { h.RefreshStorage(ctx) })
}
