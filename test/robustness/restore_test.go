package robustness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/failpoint"
	"github.com/shoaldb/shoal/test/robustness/topology"
	"github.com/shoaldb/shoal/test/robustness/traffic"
	"github.com/shoaldb/shoal/test/robustness/validate"
)

// restoreDeletes is how many databases created before the backup the
// catalog-restore failpoint deletes between the backup and the restore
// (the creators delete each database right after creating it, so none of
// theirs is created before the backup and deleted after it).
const restoreDeletes = 4

// restoreWithin bounds `shoal cluster backup` and `shoal cluster
// restore`, retried across leader changes.
const restoreWithin = 60 * time.Second

// catalogRestore is the catalog-restore failpoint: at the injection, a
// backup of the catalog (`shoal cluster backup`) under traffic; for the
// fault's duration the traffic goes on creating, deleting and writing, and
// restoreDeletes databases created before the backup are deleted; at the
// heal, the whole catalog is restored from the backup (`shoal cluster
// restore`, to the leader) — an operator rewinding the catalog. The
// scenario's checks then expect the restore's effects (validate.RestoreSets)
// rather than one catalog history. One per schedule (env.restore).
func (e *env) catalogRestore() failpoint.Failpoint {
	require.Nil(e.t, e.restore, "one catalog restore per schedule")
	rs := &validate.CatalogRestore{}
	e.restore = rs
	file := filepath.Join(e.t.TempDir(), "catalog.bak")
	f := failpoint.Custom(failpoint.CatalogRestore, "catalog", "backup, then restore from it", e.sched.fault,
		func() error {
			rs.BackupCall = e.hist.Now()
			out, err := e.c.BackupCatalog(e.ctx, file, restoreWithin)
			rs.BackupReturn = e.hist.Now()
			e.t.Logf("catalog backup: %s", strings.TrimSpace(out))
			return err
		},
		func() error {
			rs.RestoreCall = e.hist.Now()
			out, err := e.c.RestoreCatalog(e.ctx, file, restoreWithin)
			rs.RestoreReturn = e.hist.Now()
			e.t.Logf("catalog restore: %s", strings.TrimSpace(out))
			return err
		})
	return f.WithDuring(func(ctx context.Context) {
		// Databases acknowledged before the backup was called: active in
		// it. Deleted now (client 905), they come back with the restore.
		var before []string
		for _, op := range e.hist.Ops() {
			if op.Kind == traffic.Create && op.Outcome == traffic.OK && op.Return < rs.BackupCall {
				before = append(before, op.DB)
			}
		}
		live := map[string]bool{}
		for _, db := range e.load.Live() {
			live[db] = true
		}
		n := 0
		for _, i := range e.r.Perm(len(before)) {
			db := before[i]
			if n == restoreDeletes || ctx.Err() != nil {
				break
			}
			if !live[db] {
				continue
			}
			e.load.Drop(db)
			op := e.cl.Delete(e.ctx, 905, e.r.IntN(e.cl.Edges()), db)
			if op.Outcome == traffic.OK {
				n++
			}
		}
	})
}

// restoreAlarms reads, for every object host, what an operator sees after
// the restore: its /v1/status alarms, `shoal cluster status` (asked of the
// leader), its heartbeat counter of lost_held verdicts, its output, and
// its resurrected databases (GET /v1/resurrected, the gauge).
func (e *env) restoreAlarms() []validate.HostAlarms {
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	cli := ""
	if l, err := e.c.Leader(ctx); err == nil {
		out, err := e.c.CLI(ctx, "cluster", "status", "--addr", l.Addr)
		if err != nil {
			e.t.Errorf("shoal cluster status: %v", err)
		}
		cli = out
		e.t.Logf("shoal cluster status after the restore:\n%s", out)
	}
	var out []validate.HostAlarms
	for _, h := range e.c.Hosts {
		a := validate.HostAlarms{Host: h.Name, Output: h.Output()}
		a.CLI = strings.Contains(cli, "ALARM "+h.Name+" lost_databases")
		a.ResurrectedCLI = strings.Contains(cli, "ALARM "+h.Name+" resurrected_databases")
		resp, err := h.HTTP.Get(h.URL("/v1/status"))
		if err != nil {
			a.StatusError = err.Error()
			out = append(out, a)
			continue
		}
		var env struct { // the v4 envelope
			Result struct {
				Alarms []struct {
					Kind      string   `json:"kind"`
					Databases int      `json:"databases"`
					Sample    []string `json:"sample"`
					TotalHeld int64    `json:"total_held"`
				} `json:"alarms"`
			} `json:"result"`
		}
		err = json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		st := env.Result
		if err != nil {
			a.StatusError = err.Error()
		}
		for _, al := range st.Alarms {
			switch al.Kind {
			case "lost_databases":
				a.Alarm, a.Sample = true, al.Sample
				e.t.Logf("%s: lost_databases, %d in the last pass, %d held since start, sample %v", h.Name, al.Databases, al.TotalHeld, al.Sample)
			case "resurrected_databases":
				a.ResurrectedAlarm, a.ResurrectedCount, a.ResurrectedSample = true, al.Databases, al.Sample
				e.t.Logf("%s: resurrected_databases, %d databases, sample %v", h.Name, al.Databases, al.Sample)
			}
		}
		a.LostHeld = scrapeLabeled(h, "shoal_objecthost_heartbeats_total", `outcome="lost_held"`)
		e.readResurrected(h, &a)
		out = append(out, a)
	}
	return out
}

// readResurrected fills a's resurrected list (GET /v1/resurrected) and
// gauge from host h.
func (e *env) readResurrected(h *topology.Member, a *validate.HostAlarms) {
	a.ResurrectedGauge = scrapeGauge(h, "shoal_objecthost_resurrected_databases")
	resp, err := h.HTTP.Get(h.URL("/v1/resurrected"))
	if err != nil {
		a.StatusError = err.Error()
		return
	}
	defer resp.Body.Close()
	var env struct {
		Result struct {
			Databases []struct {
				DatabaseUUID string `json:"database_uuid"`
			} `json:"databases"`
		} `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		a.StatusError = "GET /v1/resurrected: " + err.Error()
		return
	}
	a.ResurrectedList = nil
	for _, d := range env.Result.Databases {
		a.ResurrectedList = append(a.ResurrectedList, d.DatabaseUUID)
	}
}

// hostsResurrected reads every host's resurrected_databases alarm, list
// and gauge (no CLI, no log): what ResurrectedAlarmCleared checks.
func (e *env) hostsResurrected() []validate.HostAlarms {
	var out []validate.HostAlarms
	for _, h := range e.c.Hosts {
		a := validate.HostAlarms{Host: h.Name}
		resp, err := h.HTTP.Get(h.URL("/v1/status"))
		if err != nil {
			a.StatusError = err.Error()
			out = append(out, a)
			continue
		}
		var env struct {
			Result struct {
				Alarms []struct {
					Kind      string   `json:"kind"`
					Databases int      `json:"databases"`
					Sample    []string `json:"sample"`
				} `json:"alarms"`
			} `json:"result"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
			a.StatusError = err.Error()
		}
		resp.Body.Close()
		for _, al := range env.Result.Alarms {
			if al.Kind == "resurrected_databases" {
				a.ResurrectedAlarm, a.ResurrectedCount, a.ResurrectedSample = true, al.Databases, al.Sample
			}
		}
		e.readResurrected(h, &a)
		out = append(out, a)
	}
	return out
}

// resurrectedCLI runs `shoal cluster resurrected --json` (with --delete
// --yes when del) against the leader and answers its rows.
func (e *env) resurrectedCLI(del bool) ([]resurrectedRow, error) {
	ctx, cancel := context.WithTimeout(e.ctx, restoreWithin)
	defer cancel()
	l, err := e.c.Leader(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"cluster", "resurrected", "--json", "--addr", l.Addr}
	if del {
		args = append(args, "--delete", "--yes")
	}
	out, err := e.c.CLI(ctx, args...)
	e.t.Logf("shoal %s:\n%s", strings.Join(args, " "), out)
	i := strings.IndexByte(out, '{')
	if err != nil && i < 0 {
		return nil, err
	}
	// Exit status 1 with JSON: some rows could not be checked or deleted
	// (their error field, logged above; a conditional delete refused
	// because a recovery relocated the database is one). The rows are
	// still the answer.
	var res struct {
		Databases []resurrectedRow `json:"databases"`
	}
	if i < 0 {
		return nil, fmt.Errorf("shoal cluster resurrected --json printed no JSON")
	}
	if err := json.NewDecoder(strings.NewReader(out[i:])).Decode(&res); err != nil {
		return nil, fmt.Errorf("shoal cluster resurrected --json: %w", err)
	}
	return res.Databases, nil
}

// resurrectedRow is a row of `shoal cluster resurrected --json`.
type resurrectedRow struct {
	Host         string `json:"host"`
	DatabaseUUID string `json:"database_uuid"`
	Catalog      string `json:"catalog"`
	Deleted      bool   `json:"deleted"`
	Error        string `json:"error"`
}

// scrapeGauge reads an unlabelled series of m's /metrics page (-1 if the
// page cannot be read, 0 if the series is absent).
func scrapeGauge(m *topology.Member, name string) float64 {
	resp, err := m.HTTP.Get(m.URL("/metrics"))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// scrapeLabeled reads one counter of m's /metrics page: the sample of name
// whose labels contain label (-1 if the page cannot be read).
func scrapeLabeled(m *topology.Member, name, label string) float64 {
	resp, err := m.HTTP.Get(m.URL("/metrics"))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, label) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			return v
		}
	}
	return 0
}

// redeleteResurrected is the operator's remedy for the databases the
// restore brought back although their delete had been acknowledged: the
// first one the final list shows is deleted again through the API (`shoal
// d1 delete`'s request), the rest with `shoal cluster resurrected --delete
// --yes` (each deletion it reports recorded as a delete spanning the
// command, so the existence model sees it); then each is read
// linearizably. It also answers what `shoal cluster resurrected` listed as
// active before deleting anything.
func (e *env) redeleteResurrected(s validate.RestoreSets, f validate.Final) (map[string]validate.Redelete, []string) {
	out := map[string]validate.Redelete{}
	var listed []string
	for db := range s.ResurrectedMaybe {
		if f.Listed[db] {
			listed = append(listed, db)
		}
	}
	sort.Strings(listed)
	var active []string
	rows, err := e.resurrectedCLI(false)
	if err != nil {
		e.t.Errorf("shoal cluster resurrected: %v", err)
	}
	for _, r := range rows {
		if r.Catalog == "active" {
			active = append(active, r.DatabaseUUID)
		}
	}
	if len(listed) > 0 {
		db := listed[0]
		var op traffic.Op
		deadline := time.Now().Add(settleFor)
		for {
			op = e.cl.Delete(e.ctx, finalClient, 0, db)
			if op.Outcome != traffic.Unknown || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond) // retry interval of an unknown-outcome delete
		}
		out[db] = validate.Redelete{Outcome: op.Outcome, Answer: op.Answer}
	}
	if len(listed) > 1 {
		call := e.hist.Now()
		rows, err := e.resurrectedCLI(true)
		ret := e.hist.Now()
		if err != nil {
			e.t.Errorf("shoal cluster resurrected --delete: %v", err)
		}
		for _, r := range rows {
			if !r.Deleted {
				continue
			}
			op := e.hist.Add(traffic.Op{Client: finalClient, Kind: traffic.Delete, DB: r.DatabaseUUID, Call: call, Return: ret,
				Outcome: traffic.OK, Answer: "shoal cluster resurrected --delete (host " + r.Host + ")"})
			out[r.DatabaseUUID] = validate.Redelete{Outcome: op.Outcome, Answer: op.Answer}
		}
	}
	for db, rd := range out {
		get := e.cl.LinGet(e.ctx, finalClient, db)
		rd.FoundAfter = get.Outcome != traffic.OK || get.Found
		out[db] = rd
	}
	return out, active
}

// resurrectedCleared waits (up to settleFor) until no host names a
// resurrected database any more, and answers what they showed last.
func (e *env) resurrectedCleared() []validate.HostAlarms {
	deadline := time.Now().Add(settleFor)
	for {
		hosts := e.hostsResurrected()
		clear := true
		for _, h := range hosts {
			if h.StatusError != "" || h.ResurrectedAlarm || h.ResurrectedGauge != 0 || len(h.ResurrectedList) > 0 {
				clear = false
			}
		}
		if clear || time.Now().After(deadline) {
			return hosts
		}
		time.Sleep(500 * time.Millisecond) // poll interval of a wait on the event itself (the hosts clear at their next real heartbeat, in other processes)
	}
}

// withoutDBs returns ops minus those on the databases in drop.
func withoutDBs(ops []traffic.Op, drop map[string]bool) []traffic.Op {
	var out []traffic.Op
	for _, op := range ops {
		if !drop[op.DB] {
			out = append(out, op)
		}
	}
	return out
}

// objectsWithout returns objs minus the objects of the databases in drop.
func objectsWithout(objs []validate.Object, drop map[string]bool) []validate.Object {
	var out []validate.Object
	for _, o := range objs {
		if !drop[o.DatabaseUUID] {
			out = append(out, o)
		}
	}
	return out
}

// rowsWithout returns the catalog rows minus the databases in drop.
func rowsWithout(rows map[string]validate.CatalogRow, drop map[string]bool) map[string]validate.CatalogRow {
	out := map[string]validate.CatalogRow{}
	for db, r := range rows {
		if !drop[db] {
			out[db] = r
		}
	}
	return out
}

// finalWithout returns f with the databases in drop left out of its list.
func finalWithout(f validate.Final, drop map[string]bool) validate.Final {
	listed := map[string]bool{}
	for db, ok := range f.Listed {
		if !drop[db] {
			listed[db] = ok
		}
	}
	f.Listed = listed
	return f
}

// TestFaultCatalogRestoredFromOlderBackup: under traffic (creates, deletes,
// writes, gets and lists at both levels, time travel), the catalog is
// backed up (`shoal cluster backup`), the traffic goes on (new databases,
// deletes — among them databases created before the backup — and writes),
// and then the whole catalog is restored from that older backup (`shoal
// cluster restore`); the traffic goes on after it. Issue 12's third
// variant of the stale-read scenario. The checks expect the rewind: the
// databases created after the backup leave the catalog and their hosts
// keep serving them, with every acknowledged row, and raise
// lost_databases (status, `shoal cluster status`, metrics, log); the
// databases deleted after the backup come back in the catalog, stay
// deleted on their hosts and are cleared by a second delete; the catalog's
// existence history is linearizable on each side of the restore; every
// other check of the suite holds as in any schedule. Long: a kill -9 of a
// catalog follower and of a host after the restore.
//
// `make fault` only: its short schedule takes 80–150 s on these machines
// (cluster start, the schedule, the settle and the checks), not "well under
// a minute", so `make test` leaves it out. SHOAL_FAULT=long (make fault)
// runs the long schedule; any other non-empty SHOAL_FAULT (e.g. short) the
// short one.
func TestFaultCatalogRestoredFromOlderBackup(t *testing.T) {
	if os.Getenv("SHOAL_FAULT") == "" {
		t.Skip("make fault only (80–150 s); SHOAL_FAULT=short runs its short schedule, SHOAL_FAULT=long its long one")
	}
	sched := scheduleOf(t)
	if sched.long {
		// The long load restores every 80 s (for schedules of many
		// minutes); this one lasts about one: restore every 10 s, within
		// the hosts' 10 per 10 minutes per database (its first long run
		// acknowledged no restore and failed the "vacuous" floor).
		sched.load.RestoreEvery = 10 * time.Second
	}
	scenario(t, t.Name(), sched, func(e *env) {
		e.run(e.catalogRestore())
		if sched.long {
			e.run(e.killMember(e.followers()[0]))
			e.run(e.killHost(e.c.Hosts[0]))
		}
	})
}

// restoreSummary is the restore's line in the run's log.
func restoreSummary(rs *validate.CatalogRestore, s validate.RestoreSets) string {
	return fmt.Sprintf("catalog backup %s → %s, restore %s → %s: %d databases dropped from the catalog (%d across a call), %d deleted ones back (%d across a call)",
		rs.BackupCall.Round(time.Millisecond), rs.BackupReturn.Round(time.Millisecond), rs.RestoreCall.Round(time.Millisecond), rs.RestoreReturn.Round(time.Millisecond),
		len(s.Lost), len(s.LostMaybe)-len(s.Lost), len(s.Resurrected), len(s.ResurrectedMaybe)-len(s.Resurrected))
}
