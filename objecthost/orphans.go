package objecthost

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// Orphan kills are the one place the host destroys on the catalog's word
// alone, so they follow the destruction contract on Catalog:
//
//  1. a stale "unknown" is only a suspicion: it is re-asked with a
//     linearizable read (ConfirmHeartbeat); a failed confirmation deletes
//     nothing and the database heartbeats again next interval;
//  2. a database that was ever confirmed active (by the create flow or a
//     heartbeat) is not the orphan of a failed create: if the catalog no
//     longer knows it, the catalog lost it (a restore from an old backup, a
//     bug), and the host keeps it and raises the "lost" alarm;
//  3. a pass whose confirmed orphans are more than max(OrphanMassFloor,
//     OrphanMassFraction × databases sent) kills none of them and raises the
//     "mass" alarm: a mass of destructive verdicts at once is a bug to stop
//     and report, not a job to finish.
//
// Held databases keep serving and heartbeating, so a held verdict comes back
// every interval while its cause lasts. An alarm stays raised until
// alarmHold has passed since the last pass that raised it; an operator sees
// it in the host's /v1/status, `shoal cluster status`, the metrics
// (shoal_objecthost_alarms, heartbeat outcomes orphan_held and lost_held)
// and the log (one error line per pass, one per lost database).

// alarmHold is how long a raised alarm stays visible after the pass that
// raised it, so an operator polling status every few seconds sees it.
const alarmHold = 10 * time.Minute

// Alarm is one raised alarm of a host.
type Alarm struct {
	Kind      string    `json:"kind"` // e.g. "mass_orphans", "lost_databases", "resurrected_databases"
	Databases int       `json:"databases"`
	Sample    []string  `json:"sample"` // a few database UUIDs
	Message   string    `json:"message"`
	RaisedAt  time.Time `json:"raised_at"`
	LastSeen  time.Time `json:"last_seen"`
	TotalHeld int64     `json:"total_held"` // verdicts held since start
	// hold: how long it stays visible after LastSeen, if longer than
	// alarmHold (an alarm raised by an hourly pass stays until the next).
	hold time.Duration
}

type alarmSet struct {
	mu     sync.Mutex
	alarms map[string]*Alarm
}

func sampleUUIDs(objs []*object, n int) []string {
	out := make([]string, 0, min(n, len(objs)))
	for _, o := range objs[:min(n, len(objs))] {
		out = append(out, o.meta.Load().DatabaseUUID)
	}
	return out
}

// alarmLocked returns the alarm of kind, raised now if it was not (s.mu held).
func (s *alarmSet) alarmLocked(kind string, now time.Time) *Alarm {
	if s.alarms == nil {
		s.alarms = map[string]*Alarm{}
	}
	a := s.alarms[kind]
	if a == nil {
		a = &Alarm{Kind: kind, RaisedAt: now}
		s.alarms[kind] = a
	}
	return a
}

func (s *alarmSet) raise(kind string, now time.Time, objs []*object, msg string) {
	sample := sampleUUIDs(objs, 5)
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.alarmLocked(kind, now)
	a.Databases, a.Sample, a.Message, a.LastSeen = len(objs), sample, msg, now
	a.TotalHeld += int64(len(objs))
}

// raiseFor raises an alarm about databases named by UUID (n of them, a
// sample given) that stays visible for hold after this pass (at least
// alarmHold): raised by a pass that runs less often than status is read.
func (s *alarmSet) raiseFor(kind string, now time.Time, n int, sample []string, hold time.Duration, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.alarmLocked(kind, now)
	a.Databases, a.Sample, a.Message, a.LastSeen, a.hold = n, sample[:min(5, len(sample))], msg, now, hold
	a.TotalHeld += int64(n)
}

// set raises an alarm that states a condition rather than counts
// verdicts: n databases now (a sample given), total as TotalHeld, visible
// for hold after this pass unless cleared first (resurrected.go).
func (s *alarmSet) set(kind string, now time.Time, n int, sample []string, hold time.Duration, msg string, total int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.alarmLocked(kind, now)
	a.Databases, a.Sample, a.Message, a.LastSeen, a.hold, a.TotalHeld = n, sample[:min(5, len(sample))], msg, now, hold, total
}

// clear drops an alarm (the condition that raised it is gone).
func (s *alarmSet) clear(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.alarms, kind)
}

// list returns the alarms seen within alarmHold of now, oldest first.
func (s *alarmSet) list(now time.Time) []Alarm {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Alarm{}
	for k, a := range s.alarms {
		if now.Sub(a.LastSeen) > max(alarmHold, a.hold) {
			delete(s.alarms, k)
			continue
		}
		out = append(out, *a)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].RaisedAt.Before(out[j-1].RaisedAt); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// Alarms returns the host's raised alarms (empty when none).
func (h *Host) Alarms() []Alarm { return h.alarms.list(h.now()) }

// HostStatus is what GET /v1/status answers (and `shoal cluster status`
// shows per host).
type HostStatus struct {
	ID        string  `json:"id"`
	Address   string  `json:"address"`
	Active    int     `json:"active"`
	Deleted   int     `json:"deleted"`
	Bytes     int64   `json:"bytes"`
	Alarms    []Alarm `json:"alarms"`
	Scheduled int     `json:"heartbeats_scheduled"`
	// DeclaredLost: the catalog answered the last registration with state
	// "lost" (relocated.go).
	DeclaredLost bool `json:"declared_lost,omitempty"`
	// Resurrected: databases deleted here that the catalog lists active
	// again (resurrected.go; the full list: GET /v1/resurrected).
	Resurrected int `json:"resurrected_databases,omitempty"`
}

// Status returns the host's counts and alarms.
func (h *Host) Status() HostStatus {
	st := h.Stats()
	return HostStatus{ID: h.cfg.ID, Address: h.cfg.Address, Active: st.Active, Deleted: st.Deleted, Bytes: st.Bytes,
		Alarms: h.Alarms(), Scheduled: h.sched.len(), DeclaredLost: h.declaredLost.Load(), Resurrected: len(h.Resurrected())}
}

// confirmUnknown re-asks the catalog, linearizably, about databases a
// heartbeat answered unknown past the creation grace. Known ones go through
// apply like any heartbeat answer; confirmed unknowns that were never
// confirmed active are returned as orphans; the others are held (alarm).
func (h *Host) confirmUnknown(ctx context.Context, suspects []*object, rep *HeartbeatReport, apply func(fsm.HeartbeatState, *object)) []*object {
	ans, byUUID, ok := h.confirmLinearizably(ctx, suspects, rep, "confirm_unknown",
		"confirming databases unknown to a stale catalog read failed; none deleted, asking again next beat")
	if !ok {
		return nil
	}
	var orphans, lost []*object
	seen := make(map[*object]bool, len(suspects))
	for _, st := range ans.Databases {
		for _, o := range byUUID[st.UUID] {
			if seen[o] {
				continue
			}
			seen[o] = true
			switch {
			case st.Known:
				h.m.heartbeats.WithLabelValues("stale_unknown_refuted").Inc()
				apply(st, o)
			case o.meta.Load().Confirmed:
				lost = append(lost, o)
			default:
				orphans = append(orphans, o)
			}
		}
	}
	if len(lost) > 0 {
		rep.LostHeld += len(lost)
		h.m.heartbeats.WithLabelValues("lost_held").Add(float64(len(lost)))
		msg := fmt.Sprintf("%d databases once confirmed active are unknown to the catalog (linearizable read); kept, not deleted: the catalog may have been restored from an old backup", len(lost))
		h.alarms.raise("lost_databases", h.now(), lost, msg)
		for _, o := range lost {
			m := o.meta.Load()
			h.log.Error("database unknown to the catalog although it was confirmed active; keeping it",
				"database", m.DatabaseUUID, "account", m.AccountID, "object", m.ObjectID)
		}
	}
	return orphans
}

// confirmLinearizably re-asks the catalog, linearizably (ConfirmHeartbeat),
// about objs' databases; it answers the catalog's answer and objs by UUID,
// or ok=false after logging failMsg (a failed confirmation changes
// nothing). call names the catalog call in the metrics.
func (h *Host) confirmLinearizably(ctx context.Context, objs []*object, rep *HeartbeatReport, call, failMsg string) (fsm.HeartbeatAnswer, map[string][]*object, bool) {
	uuids := make([]string, 0, len(objs))
	byUUID := make(map[string][]*object, len(objs))
	for _, o := range objs {
		u := o.meta.Load().DatabaseUUID
		if byUUID[u] == nil {
			uuids = append(uuids, u)
		}
		byUUID[u] = append(byUUID[u], o)
	}
	rep.Confirmations += len(uuids)
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
	ans, err := h.cfg.Catalog.ConfirmHeartbeat(cctx, uuids)
	cancel()
	if err != nil {
		h.m.catalogCalls.WithLabelValues(call, "error").Inc()
		h.log.Warn(failMsg, "databases", len(uuids), "err", err)
		return ans, nil, false
	}
	h.m.catalogCalls.WithLabelValues(call, "ok").Inc()
	return ans, byUUID, true
}

// killOrphans deletes the pass's confirmed orphans, unless they are a mass:
// more than max(OrphanMassFloor, OrphanMassFraction × databases sent).
func (h *Host) killOrphans(ctx context.Context, orphans []*object, rep *HeartbeatReport) {
	if len(orphans) == 0 {
		return
	}
	limit := max(h.cfg.OrphanMassFloor, int(h.cfg.OrphanMassFraction*float64(rep.Sent)))
	if len(orphans) > limit {
		rep.OrphansHeld += len(orphans)
		h.m.heartbeats.WithLabelValues("orphan_held").Add(float64(len(orphans)))
		msg := fmt.Sprintf("%d of %d databases in one heartbeat pass are orphans by the catalog's linearizable answer (limit %d); none deleted", len(orphans), rep.Sent, limit)
		h.alarms.raise("mass_orphans", h.now(), orphans, msg)
		h.log.Error("mass of orphan verdicts; deleting none", "orphans", len(orphans), "sent", rep.Sent, "limit", limit,
			"sample", sampleUUIDs(orphans, 5))
		return
	}
	// Fence before deleting: a create of one of these UUIDs may be in
	// flight (proposed, not yet committed: the confirming read could not
	// see it). Once fenced it can never commit; one that committed first
	// is answered known and its object kept (the next heartbeat applies
	// its state). The fence is this flow's checkpoint: a crash after it
	// leaves fenced UUIDs whose objects the next pass fences again (a
	// no-op) and deletes.
	fctx, cancel := context.WithTimeout(ctx, h.cfg.CatalogTimeout)
	uuids := make([]string, 0, len(orphans))
	for _, o := range orphans {
		uuids = append(uuids, o.meta.Load().DatabaseUUID)
	}
	ans, err := h.cfg.Catalog.FenceOrphans(fctx, h.cfg.ID, uuids)
	cancel()
	if err != nil {
		h.m.catalogCalls.WithLabelValues("fence_orphans", "error").Inc()
		h.log.Warn("fencing orphans failed; none deleted, asking again next beat", "orphans", len(orphans), "err", err)
		return
	}
	h.m.catalogCalls.WithLabelValues("fence_orphans", "ok").Inc()
	fenced := make(map[string]bool, len(ans.Fenced))
	for _, u := range ans.Fenced {
		fenced[u] = true
	}
	kill := orphans[:0:0]
	for _, o := range orphans {
		if fenced[o.meta.Load().DatabaseUUID] {
			kill = append(kill, o)
		}
	}
	if n := len(orphans) - len(kill); n > 0 {
		rep.OrphansSaved += n
		h.m.heartbeats.WithLabelValues("orphan_saved_by_fence").Add(float64(n))
		h.log.Info("orphan verdicts refuted by the fence: their create committed after the confirming read; kept", "databases", n)
	}
	orphans = kill
	if len(orphans) == 0 {
		return
	}
	if _, err := h.markDeleted(ctx, orphans, 0, "orphan: unknown to the catalog (linearizable read) past the creation grace, never confirmed, fenced"); err != nil {
		h.log.Error("killing orphans failed; retrying next beat", "err", err)
		return
	}
	rep.OrphansKilled += len(orphans)
	h.m.heartbeats.WithLabelValues("orphan_killed").Add(float64(len(orphans)))
}
