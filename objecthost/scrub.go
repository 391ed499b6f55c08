package objecthost

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shoaldb/shoal/objecthost/history"
)

// Archive scrubbing (objecthost/history/scrub.go does the reading): the
// host reads back what it shipped, because the archive is what a lost host
// is recovered from and an object store that lost or damaged an object
// it acknowledged is otherwise found only by the restore that needs it.
//
// A pass visits every live database on the host, paced evenly over
// ScrubInterval (default 24 h: 100,000 databases are one check every
// 0.86 s). Per database: what its staging area says was shipped
// (history.ShippedOf), one listing of its archive, ScrubSample objects
// read in full (default 1), → history.Archive.Scrub. Then:
//
//   - the store failing (503, a timeout, a cut stream) is an outage, the
//     lag alarm's business: counted, nothing else — no alarm, no heal;
//   - damage (an object missing from the listing, or one whose checksum
//     fails on two full reads) is confirmed by a second check from scratch
//     (a listing that raced a shipment or the retention sweep passes the
//     second time), then:
//   - heal: when the database's current shipped point no longer restores,
//     the host opens the database and ships a fresh snapshot of its
//     current commit (history.Capturer.Rebase, then Shipper.Sync):
//     *checkpoint: that Put* — from it on every point restores again.
//     Nothing in the archive is deleted or overwritten, except a
//     snapshot of that same commit, with the same image. A crash before
//     the Put leaves the damage in place: the next pass finds it again
//     and heals then;
//   - report what cannot be healed: the alarm archive_damaged (databases,
//     a sample, the lost ranges) in /v1/status and `shoal cluster status`,
//     each database's ranges in /v1/history/status, the gauge
//     shoal_history_archive_damaged_databases, and an error log line per
//     database when its damage is first found or changes. The alarm stays
//     while any of the host's databases has points within retention that
//     no longer restore (the next pass over it finds them again).

// scrubState is the scrubber's memory (hostHistory.scrubMu).
type scrubState struct {
	damaged  map[string]*ArchiveDamage // database UUID → its damage
	passes   int64
	lastPass time.Time
	checked  int64 // databases checked (all passes)
	errors   int64 // checks the store failed (outages)
}

// ArchiveDamage is one database's archive damage, as /v1/history/status
// shows it.
type ArchiveDamage struct {
	Database string `json:"database"`
	Object   string `json:"object"`
	// Lost: runs of points that no longer restore (bookmarks of the last
	// point before and the first after, when there are such points).
	Lost []LostPoints `json:"lost"`
	// Damaged: objects whose checksum failed; Missing: what the listing
	// lacks.
	Damaged []string `json:"damaged_objects,omitempty"`
	Missing []string `json:"missing,omitempty"`
	// HealedAt: the snapshot the host shipped so that every point from it
	// on restores ("" if no heal was needed or it has not succeeded yet).
	HealedAt  string    `json:"healed_at,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// LostPoints is history.LostRange with bookmarks and times.
type LostPoints struct {
	Gen       string `json:"gen"`
	FirstTxid uint64 `json:"first_txid"`
	LastTxid  uint64 `json:"last_txid"`
	// After is the last point before the range that restores, Until the
	// first after it ("" when there is none): the lost commits' own
	// times are lost with them and lie between AfterTime and UntilTime.
	After     string    `json:"after_bookmark,omitempty"`
	AfterTime time.Time `json:"after_time,omitzero"`
	Until     string    `json:"until_bookmark,omitempty"`
	UntilTime time.Time `json:"until_time,omitzero"`
}

func (l LostPoints) String() string {
	s := fmt.Sprintf("generation %s txids %d..%d", l.Gen, l.FirstTxid, l.LastTxid)
	if l.After != "" {
		s += " after " + l.AfterTime.Format(time.RFC3339Nano)
	}
	if l.Until != "" {
		s += " until " + l.UntilTime.Format(time.RFC3339Nano)
	} else {
		s += " (nothing after it restores yet)"
	}
	return s
}

type scrubMetrics struct {
	checks   *prometheus.CounterVec
	requests prometheus.Counter
	read     prometheus.Counter
	bytes    prometheus.Counter
	damaged  prometheus.Gauge
	// restoreDamaged: restores refused because the archive lost or
	// damaged what they need (restoredamage.go), by op.
	restoreDamaged *prometheus.CounterVec
}

func newScrubMetrics(reg prometheus.Registerer) *scrubMetrics {
	m := &scrubMetrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_history_scrub_checks_total",
			Help: "Archive checks of one database, by outcome: ok, damaged, healed, heal_failed, store_error, transient (damage not confirmed)."}, []string{"outcome"}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_history_scrub_requests_total", Help: "Store requests made by the archive scrubber (listing pages and object reads)."}),
		read:     prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_history_scrub_objects_read_total", Help: "Archived objects read in full and verified by the scrubber."}),
		bytes:    prometheus.NewCounter(prometheus.CounterOpts{Name: "shoal_history_scrub_read_bytes_total", Help: "Bytes the scrubber read from the archive."}),
		damaged:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "shoal_history_archive_damaged_databases", Help: "Databases on this host whose archive lost points that no longer restore, or holds damaged objects (alarm archive_damaged)."}),
		restoreDamaged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shoal_history_restore_damaged_total",
			Help: "Restores refused because the archive lost or damaged the history they need, by op: restore (time travel), bookmark (a timestamp's), export (at a bookmark), fork, recover (a lost host's database)."}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.checks, m.requests, m.read, m.bytes, m.damaged, m.restoreDamaged)
	}
	return m
}

// scrubLoop runs scrub passes until ctx ends.
func (hh *hostHistory) scrubLoop(ctx context.Context, h *Host) {
	for ctx.Err() == nil {
		start := h.now()
		hh.scrubPass(ctx, h)
		// A pass over few databases ends early: wait out the interval.
		if rest := hh.cfg.ScrubInterval - h.now().Sub(start); rest > 0 {
			t := time.NewTimer(rest)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

type scrubTarget struct{ objectID, uuid string }

// scrubPass checks every live database once, spread over ScrubInterval.
func (hh *hostHistory) scrubPass(ctx context.Context, h *Host) {
	h.mu.RLock()
	targets := make([]scrubTarget, 0, len(h.objects))
	for id, o := range h.objects {
		if m := o.meta.Load(); m != nil && !m.deleted() {
			targets = append(targets, scrubTarget{id, m.DatabaseUUID})
		}
	}
	h.mu.RUnlock()
	live := make(map[string]bool, len(targets))
	for _, t := range targets {
		live[t.uuid] = true
	}
	hh.scrubMu.Lock()
	for u := range hh.scrub.damaged {
		if !live[u] {
			delete(hh.scrub.damaged, u) // deleted or moved away: not this host's to report
		}
	}
	hh.scrubMu.Unlock()
	hh.updateDamageAlarm(h)
	rand.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	var pace time.Duration
	if len(targets) > 0 {
		pace = hh.cfg.ScrubInterval / time.Duration(len(targets))
	}
	t := time.NewTimer(time.Hour)
	t.Stop() // Reset below (Go ≥ 1.23: no stale tick to drain)
	defer t.Stop()
	for _, tg := range targets {
		if pace > 0 {
			t.Reset(pace)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			return
		}
		hh.scrubOne(ctx, h, tg.objectID, tg.uuid, hh.cfg.ScrubSample)
	}
	hh.scrubMu.Lock()
	hh.scrub.passes++
	hh.scrub.lastPass = h.now()
	hh.scrubMu.Unlock()
}

// ScrubNow checks every live database's archive once, now, without
// pacing, reading sample objects of each (0: the configured ScrubSample;
// negative: all): tests, and an operator after a known incident of the
// store (POST /v1/history/scrub).
func (h *Host) ScrubNow(ctx context.Context, sample int) error {
	hh, err := h.historyOn()
	if err != nil {
		return err
	}
	if sample == 0 {
		sample = hh.cfg.ScrubSample
	}
	h.mu.RLock()
	targets := make([]scrubTarget, 0, len(h.objects))
	for id, o := range h.objects {
		if m := o.meta.Load(); m != nil && !m.deleted() {
			targets = append(targets, scrubTarget{id, m.DatabaseUUID})
		}
	}
	h.mu.RUnlock()
	sort.Slice(targets, func(i, j int) bool { return targets[i].uuid < targets[j].uuid })
	for _, tg := range targets {
		if err := ctx.Err(); err != nil {
			return err
		}
		hh.scrubOne(ctx, h, tg.objectID, tg.uuid, sample)
	}
	return nil
}

// check reads what the staging area says was shipped, then the archive
// (in that order: see history.ShippedOf).
func (hh *hostHistory) check(ctx context.Context, h *Host, objectID, uuid string, sample int, found []string) (history.ScrubReport, error) {
	sh, err := history.ShippedOf(hh.cfg.StagingDir, history.StagingArea{Key: uuid, Name: objectID})
	if err != nil {
		h.log.Warn("history: scrub: staging area unreadable; checking the archive without it", "db", uuid, "err", err)
		sh = history.Shipped{}
	}
	// Objects found damaged before stay damaged until read again and found
	// whole (a pass whose sample misses them must not clear the alarm).
	var known []string
	hh.scrubMu.Lock()
	if d := hh.scrub.damaged[uuid]; d != nil {
		known = d.Damaged
	}
	hh.scrubMu.Unlock()
	known = append(known[:len(known):len(known)], found...)
	rep, err := hh.archive.Scrub(ctx, uuid, sh, history.ScrubOptions{Sample: sample, Damaged: known, Cutoff: h.now().Add(-hh.cfg.Retention)})
	hh.sm.requests.Add(float64(rep.Requests))
	hh.sm.read.Add(float64(rep.Read))
	hh.sm.bytes.Add(float64(rep.ReadBytes))
	return rep, err
}

// scrubOne checks one database's archive, heals it if its current point no
// longer restores, and records what no longer restores.
//
// found are objects a restore just found damaged: read again whatever the
// sample (restoredamage.go).
func (hh *hostHistory) scrubOne(ctx context.Context, h *Host, objectID, uuid string, sample int, found ...string) {
	// Not beside the retention sweep (its deletions would look like
	// losses to a listing taken meanwhile; the confirmation would catch
	// it, but need not).
	hh.archiveMu.Lock()
	defer hh.archiveMu.Unlock()
	hh.scrubMu.Lock()
	hh.scrub.checked++
	hh.scrubMu.Unlock()
	rep, err := hh.check(ctx, h, objectID, uuid, sample, found)
	if err == nil && rep.Damage() {
		// Confirm from scratch: only absence in two listings counts (a
		// checksum failure was confirmed by Scrub's second read; the
		// objects it found stay damaged here even if this sample misses
		// them).
		first := rep
		rep, err = hh.check(ctx, h, objectID, uuid, sample, append(first.Damaged[:len(first.Damaged):len(first.Damaged)], found...))
		if err == nil && !rep.Damage() {
			hh.sm.checks.WithLabelValues("transient").Inc()
			h.log.Info("history: scrub: damage not confirmed by a second check", "db", uuid, "missing", first.Missing, "damaged", first.Damaged)
			hh.noDamage(h, uuid)
			return
		}
	}
	if err != nil {
		// An outage (or this host shutting down): never damage.
		hh.sm.checks.WithLabelValues("store_error").Inc()
		hh.scrubMu.Lock()
		hh.scrub.errors++
		hh.scrubMu.Unlock()
		if ctx.Err() == nil {
			h.log.Warn("history: scrub: the archive store failed; checked again next pass", "db", uuid, "err", err)
		}
		return
	}
	if !rep.Damage() {
		hh.sm.checks.WithLabelValues("ok").Inc()
		hh.noDamage(h, uuid)
		return
	}
	healed := ""
	outcome := "damaged"
	if !rep.Current {
		p, herr := hh.heal(ctx, h, objectID)
		if herr != nil {
			outcome = "heal_failed"
			h.log.Error("history: scrub: archive damaged and not healed yet (retried next pass)", "db", uuid, "object", objectID, "err", herr)
		} else {
			outcome = "healed"
			healed = string(history.MakeBookmark(uuid, p))
			// What no longer restores now that the heal is in place.
			if r2, err := hh.check(ctx, h, objectID, uuid, sample, rep.Damaged); err == nil {
				rep = r2
			}
		}
	}
	hh.sm.checks.WithLabelValues(outcome).Inc()
	hh.recordDamage(h, objectID, uuid, rep, healed)
}

// heal ships a fresh snapshot of the database's current commit (opening
// it if it is closed). *Checkpoint: the snapshot's Put* (Shipper.Sync).
func (hh *hostHistory) heal(ctx context.Context, h *Host, objectID string) (history.Position, error) {
	c, release, err := h.current(objectID)
	if err != nil {
		return history.Position{}, err
	}
	defer release()
	if c == nil {
		return history.Position{}, errors.New("the database has no capturer")
	}
	p, err := c.Rebase()
	if err != nil {
		return history.Position{}, err
	}
	if err := hh.ship.Sync(ctx, c); err != nil {
		return history.Position{}, fmt.Errorf("ship the rebase snapshot: %w", err)
	}
	return p, nil
}

func lostPoints(uuid string, rs []history.LostRange) []LostPoints {
	out := make([]LostPoints, 0, len(rs))
	for _, r := range rs {
		l := LostPoints{Gen: r.Gen, FirstTxid: r.FirstTxid, LastTxid: r.LastTxid}
		if r.After.Gen != "" {
			l.After, l.AfterTime = string(history.MakeBookmark(uuid, r.After)), r.After.Time()
		}
		if r.Until.Gen != "" {
			l.Until, l.UntilTime = string(history.MakeBookmark(uuid, r.Until)), r.Until.Time()
		}
		out = append(out, l)
	}
	return out
}

func (hh *hostHistory) recordDamage(h *Host, objectID, uuid string, rep history.ScrubReport, healed string) {
	now := h.now()
	d := &ArchiveDamage{Database: uuid, Object: objectID, Lost: lostPoints(uuid, rep.Lost),
		Damaged: rep.Damaged, Missing: rep.Missing, HealedAt: healed, FirstSeen: now, LastSeen: now}
	hh.scrubMu.Lock()
	prev := hh.scrub.damaged[uuid]
	if prev != nil {
		d.FirstSeen = prev.FirstSeen
		if d.HealedAt == "" {
			d.HealedAt = prev.HealedAt
		}
	}
	hh.scrub.damaged[uuid] = d
	hh.scrubMu.Unlock()
	if prev == nil || fmt.Sprint(prev.Lost) != fmt.Sprint(d.Lost) {
		ranges := make([]string, len(d.Lost))
		for i, l := range d.Lost {
			ranges[i] = l.String()
		}
		h.log.Error("history: scrub: archive damaged: points no longer restore", "db", uuid, "object", objectID,
			"lost", strings.Join(ranges, "; "), "damaged_objects", rep.Damaged, "missing", rep.Missing, "healed_at", d.HealedAt)
	}
	hh.updateDamageAlarm(h)
}

func (hh *hostHistory) noDamage(h *Host, uuid string) {
	hh.scrubMu.Lock()
	_, had := hh.scrub.damaged[uuid]
	delete(hh.scrub.damaged, uuid)
	hh.scrubMu.Unlock()
	if had {
		h.log.Info("history: scrub: archive no longer damaged (the damaged range left retention)", "db", uuid)
		hh.updateDamageAlarm(h)
	}
}

// updateDamageAlarm raises archive_damaged for the databases with damage,
// or clears it.
func (hh *hostHistory) updateDamageAlarm(h *Host) {
	hh.scrubMu.Lock()
	ds := make([]*ArchiveDamage, 0, len(hh.scrub.damaged))
	for _, d := range hh.scrub.damaged {
		ds = append(ds, d)
	}
	hh.scrubMu.Unlock()
	hh.sm.damaged.Set(float64(len(ds)))
	if len(ds) == 0 {
		h.alarms.clear("archive_damaged")
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].FirstSeen.Before(ds[j].FirstSeen) })
	sample := make([]string, 0, min(5, len(ds)))
	var parts []string
	for _, d := range ds[:min(5, len(ds))] {
		sample = append(sample, d.Database)
		var rs []string
		for _, l := range d.Lost {
			rs = append(rs, l.String())
		}
		if len(rs) == 0 {
			rs = []string{"no point lost; damaged objects " + strings.Join(d.Damaged, ", ")}
		}
		s := d.Database + ": " + strings.Join(rs, "; ")
		if d.HealedAt != "" {
			s += "; healed from bookmark " + d.HealedAt
		}
		parts = append(parts, s)
	}
	msg := fmt.Sprintf("%d databases' archives lost or hold damaged objects (the object store lost what it acknowledged); points that no longer restore: %s (all in /v1/history/status)",
		len(ds), strings.Join(parts, " | "))
	h.alarms.raiseFor("archive_damaged", h.now(), len(ds), sample, 2*hh.cfg.ScrubInterval, msg)
}

// ScrubStatus is the scrubber's part of /v1/history/status.
type ScrubStatus struct {
	Interval  time.Duration   `json:"-"`
	Passes    int64           `json:"passes"`
	LastPass  time.Time       `json:"last_pass,omitzero"`
	Checked   int64           `json:"databases_checked"`
	Errors    int64           `json:"store_errors"`
	Damaged   []ArchiveDamage `json:"damaged"`
	DamagedN  int             `json:"damaged_databases"`
	Truncated bool            `json:"truncated,omitempty"`
}

// ScrubStatus returns the scrubber's state (at most 100 damaged databases
// listed).
func (h *Host) ScrubStatus() *ScrubStatus {
	hh := h.hist
	if hh == nil {
		return nil
	}
	hh.scrubMu.Lock()
	defer hh.scrubMu.Unlock()
	st := &ScrubStatus{Interval: hh.cfg.ScrubInterval, Passes: hh.scrub.passes, LastPass: hh.scrub.lastPass,
		Checked: hh.scrub.checked, Errors: hh.scrub.errors, Damaged: []ArchiveDamage{}, DamagedN: len(hh.scrub.damaged)}
	for _, d := range hh.scrub.damaged {
		st.Damaged = append(st.Damaged, *d)
	}
	sort.Slice(st.Damaged, func(i, j int) bool { return st.Damaged[i].Database < st.Damaged[j].Database })
	if len(st.Damaged) > 100 {
		st.Damaged, st.Truncated = st.Damaged[:100], true
	}
	return st
}
