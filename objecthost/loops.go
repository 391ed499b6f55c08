package objecthost

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func fsmLoad(id string, st Stats) fsm.ReportHostLoad {
	return fsm.ReportHostLoad{ID: id, Databases: int64(st.Active), Bytes: st.Bytes}
}

// startLoops starts the background goroutines; each stops when ctx is
// cancelled and Close waits for all of them.
func (h *Host) startLoops(ctx context.Context) {
	h.goEvery(ctx, h.cfg.HeartbeatTick, func(ctx context.Context) { h.RunHeartbeats(ctx) })
	h.goEvery(ctx, h.cfg.SweepInterval, func(ctx context.Context) {
		if _, err := h.Sweep(ctx); err != nil {
			h.log.Error("sweep failed", "err", err)
		}
	})
	h.startRouteRepublish(ctx)
	h.startSizeRepublish(ctx)
	h.startStorageRefresh(ctx)
	if h.cfg.Catalog == nil {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.register(ctx)
	}()
	h.goEvery(ctx, h.cfg.LoadReportInterval, func(ctx context.Context) {
		if err := h.ReportLoad(ctx); err != nil {
			h.log.Warn("load report failed", "err", err)
		}
	})
}

func (h *Host) goEvery(ctx context.Context, every time.Duration, fn func(context.Context)) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fn(ctx)
			}
		}
	}()
}

// register records the host in the catalog, retrying with capped backoff
// until it succeeds: the host serves its existing databases meanwhile (the
// catalog is not on the query path).
func (h *Host) register(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
		err := h.Register(cctx)
		cancel()
		if err == nil {
			h.m.catalogCalls.WithLabelValues("register_host", "ok").Inc()
			return
		}
		h.m.catalogCalls.WithLabelValues("register_host", "error").Inc()
		h.log.Warn("host registration failed; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// Register records the host in the catalog once (the background loop
// retries; exported for tests and the CLI).
func (h *Host) Register(ctx context.Context) error {
	rc, ok := h.cfg.Catalog.(RelocationCatalog)
	if !ok {
		return h.cfg.Catalog.RegisterHost(ctx, h.hostRecord())
	}
	row, err := rc.RegisterHostState(ctx, h.hostRecord())
	if err != nil {
		return err
	}
	h.noteHostState(row.State)
	return nil
}

// ReportLoad sends the host's database count and bytes to the catalog.
func (h *Host) ReportLoad(ctx context.Context) error {
	st := h.Stats()
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
	defer cancel()
	err := h.cfg.Catalog.ReportHostLoad(cctx, fsmLoad(h.cfg.ID, st))
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	h.m.catalogCalls.WithLabelValues("report_host_load", outcome).Inc()
	return err
}

// Sweep physically removes deleted objects older than DeletedRetention:
// their handle is closed (waiting for in-flight requests), their files are
// removed, then their index rows in one commit (a tombstone held as
// resurrected keeps its row: resurrected.go). Checkpoint: the index
// commit; a crash before it leaves deleted rows whose (already missing)
// files the next sweep removes again. Returns how many objects were swept.
func (h *Host) Sweep(ctx context.Context) (int, error) {
	if h.hist != nil {
		// Owed delete markers first (deletemark.go): a record whose
		// marker is still owed after this is kept.
		if _, err := h.hist.markDeletes(ctx, h); err != nil {
			h.log.Warn("history: writing delete markers to the archive failed; the sweep keeps their records", "err", err)
		}
	}
	cutoff := h.now().Add(-h.cfg.DeletedRetention)
	h.mu.RLock()
	var due []*object
	for id := range h.deleted {
		o := h.objects[id]
		if m := o.meta.Load(); m != nil && !m.DeletedAt.After(cutoff) {
			due = append(due, o)
		}
	}
	h.mu.RUnlock()
	if len(due) == 0 {
		return 0, nil
	}
	sortObjects(due)
	for _, o := range due {
		o.mu.Lock()
	}
	defer func() {
		for _, o := range due {
			o.mu.Unlock()
		}
	}()
	ids := make([]string, 0, len(due))
	for _, o := range due {
		if ctx.Err() != nil {
			break
		}
		id := o.meta.Load().ObjectID
		<-h.handles.evict(id)
		p := h.path(id)
		var rmErr error
		for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
			if err := os.Remove(p + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
				rmErr = err
			}
		}
		if rmErr != nil {
			h.log.Error("removing deleted database file failed; retrying next sweep", "object", id, "err", rmErr)
			continue
		}
		// Its uploads and import job files go with it (best effort: they
		// are answered only for an active object).
		_ = os.RemoveAll(h.dump.uploadDir(id))
		if h.holdsTombstone(id) || h.markPending(o.meta.Load()) {
			// A restored catalog lists its database active again, or its
			// delete marker is not in the archive yet: the files go on
			// schedule (size 0, as a sweep emits), the record stays while
			// the alarm names it (resurrected.go) or until the marker is
			// written (deletemark.go).
			h.zeroSize(o)
			continue
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return 0, ctx.Err()
	}
	if err := h.ix.remove(ids...); err != nil {
		return 0, err
	}
	swept := make(map[string]bool, len(ids))
	for _, id := range ids {
		swept[id] = true
	}
	h.mu.Lock()
	for _, o := range due {
		m := o.meta.Load()
		if !swept[m.ObjectID] {
			continue
		}
		delete(h.deleted, m.ObjectID)
		delete(h.objects, m.ObjectID)
		o.gone = true
	}
	h.mu.Unlock()
	for _, o := range due {
		if o.gone {
			h.zeroSize(o)
		}
	}
	h.m.lifecycle.WithLabelValues("swept").Add(float64(len(ids)))
	h.refreshGauges()
	return len(ids), nil
}

// zeroSize records that o's file is gone: its size 0, once.
func (h *Host) zeroSize(o *object) {
	m := o.meta.Load()
	o.sizeMu.Lock()
	defer o.sizeMu.Unlock()
	if old := o.size.Swap(0); old != 0 {
		h.totalBytes.Add(-old)
		h.cfg.Sizes.RecordSize(SizeEvent{AccountID: m.AccountID, DatabaseUUID: m.DatabaseUUID, SizeBytes: 0, Seq: h.nextSizeSeq(), Time: h.now()})
	}
}
