package validate

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/test/robustness/topology"
)

// Damage is what a host reported of one database's archive (its
// scrubber's archive_damaged): the points that no longer restore and the
// objects found damaged. CheckArchive verifies around exactly that.
type Damage struct {
	Host    string
	Lost    []history.LostRange
	Damaged []string // keys without the archive prefix
	Healed  bool
}

// HostScrub is what one host showed after its final scrub (every object
// read, POST /v1/history/scrub?sample=-1) and before its final kill.
type HostScrub struct {
	Host   string
	Status topology.ScrubStatus
	Err    string // the scrub or the status could not be read
	// Alarm: /v1/status carried archive_damaged, naming Databases
	// databases; CLI: `shoal cluster status` showed it.
	Alarm     bool
	AlarmDBs  int
	CLI       bool
	CLIErr    string
	StatusErr string
}

// Damages converts the hosts' reports into each database's Damage.
func Damages(scrubs []HostScrub) (map[string]Damage, []string) {
	out := map[string]Damage{}
	var errs []string
	for _, h := range scrubs {
		for _, d := range h.Status.Damaged {
			dm := Damage{Host: h.Host, Healed: d.HealedAt != ""}
			for _, k := range d.Damaged {
				dm.Damaged = append(dm.Damaged, strings.TrimPrefix(k, topology.ArchivePrefix))
			}
			for _, l := range d.Lost {
				r := history.LostRange{Gen: l.Gen, FirstTxid: l.FirstTxid, LastTxid: l.LastTxid}
				var err error
				if l.After != "" {
					if r.After, err = history.ParseBookmark(d.Database, history.Bookmark(l.After)); err != nil {
						errs = append(errs, fmt.Sprintf("%s: %s: after bookmark %q: %v", h.Host, d.Database, l.After, err))
					}
				}
				if l.Until != "" {
					if r.Until, err = history.ParseBookmark(d.Database, history.Bookmark(l.Until)); err != nil {
						errs = append(errs, fmt.Sprintf("%s: %s: until bookmark %q: %v", h.Host, d.Database, l.Until, err))
					}
				}
				dm.Lost = append(dm.Lost, r)
			}
			out[d.Database] = dm
		}
	}
	return out, errs
}

// ArchiveDamageReported: after the object store lost objects it had
// acknowledged (the object-store-loses failpoint: lost), every host
// reported exactly the damage there is and nothing else.
//
//   - no false damage: every database a host reports was hit;
//   - every hit database live on a host whose archive lost points or
//     holds a damaged object — by the suite's own scrub of the store
//     (every object read, ScrubReport.Damage) — is reported by that host
//     with the same lost ranges (generation and txids), healed (no range
//     without a restorable point after it in the database's newest
//     generation), and the host raised archive_damaged in /v1/status for
//     as many databases as it reports and in `shoal cluster status`;
//   - a hit whose loss no scrub can see (a deleted snapshot whose records
//     are all still there: nothing is lost) may go unreported, and a hit
//     database no host holds at the end (deleted) is scrubbed by no one:
//     both are listed in the note.
//
// own maps each hit database live at the end to the suite's own scrub;
// live maps a database to the host of its live object.
func ArchiveDamageReported(lost []topology.LostObject, scrubs []HostScrub, own map[string]history.ScrubReport, live map[string]string) Result {
	r := Result{Check: "the store lost acknowledged archive objects: each host's scrubber reports exactly the databases hit whose archive shows it, with the lost ranges, healed, alarm archive_damaged in /v1/status and `shoal cluster status`"}
	hit := map[string][]string{}
	for _, l := range lost {
		hit[l.DB()] = append(hit[l.DB()], l.How+" "+strings.TrimPrefix(l.Key, topology.ArchivePrefix))
	}
	reported, errs := Damages(scrubs)
	r.Violations = append(r.Violations, errs...)
	for _, h := range scrubs {
		if h.Err != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: final scrub: %s", h.Host, h.Err))
			continue
		}
		n := len(h.Status.Damaged)
		if n > 0 && (!h.Alarm || h.AlarmDBs != h.Status.DamagedN) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: reports %d damaged archives, /v1/status alarm archive_damaged %v for %d%s", h.Host, h.Status.DamagedN, h.Alarm, h.AlarmDBs, errNote(h.StatusErr)))
		}
		if n > 0 && !h.CLI {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: `shoal cluster status` shows no archive_damaged alarm%s", h.Host, errNote(h.CLIErr)))
		}
		if n == 0 && h.Alarm {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: archive_damaged raised with nothing reported", h.Host))
		}
	}
	var dbs []string
	for db := range reported {
		dbs = append(dbs, db)
	}
	sort.Strings(dbs)
	for _, db := range dbs {
		if _, ok := hit[db]; !ok {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: %s reported damaged, the store lost nothing of it", reported[db].Host, db))
		}
	}
	var notes []string
	var hitDBs []string
	for db := range hit {
		hitDBs = append(hitDBs, db)
	}
	sort.Strings(hitDBs)
	for _, db := range hitDBs {
		host, ok := live[db]
		if !ok {
			notes = append(notes, fmt.Sprintf("%s not live at the end (%v)", db, hit[db]))
			continue
		}
		r.Checked++
		o := own[db]
		d, rep := reported[db]
		if !o.Damage() {
			notes = append(notes, fmt.Sprintf("%s: nothing lost (%v), reported %v", db, hit[db], rep))
			continue
		}
		if !rep {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: %s hit (%v), its archive shows it (lost %v, damaged %v, missing %v), %s reports nothing",
				host, db, hit[db], o.Lost, o.Damaged, o.Missing, host))
			continue
		}
		if d.Host != host {
			r.Violations = append(r.Violations, fmt.Sprintf("%s reported by %s, live on %s", db, d.Host, host))
		}
		if !sameRanges(o.Lost, d.Lost) {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: %s reports lost %v, the archive shows %v", host, db, d.Lost, o.Lost))
		}
		if !o.Current {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: %s: the newest point of its newest generation does not restore: not healed (lost %v)", host, db, o.Lost))
		}
		notes = append(notes, fmt.Sprintf("%s: %v → lost %v, healed %v", db, hit[db], d.Lost, d.Healed))
	}
	r.Note = strings.Join(notes, "; ")
	if len(lost) == 0 {
		r.Note = "the store lost nothing; no host reported damage"
	}
	return r
}

func sameRanges(a, b []history.LostRange) bool {
	key := func(rs []history.LostRange) []string {
		var out []string
		for _, l := range rs {
			out = append(out, fmt.Sprintf("%s/%d-%d/%d/%d", l.Gen, l.FirstTxid, l.LastTxid, l.After.Txid, l.Until.Txid))
		}
		sort.Strings(out)
		return out
	}
	return slices.Equal(key(a), key(b))
}

// OwnScrub is the suite's own check of db's archive: every object read,
// with the newest generation's newest object standing in for what its
// host shipped (so that Current says whether the newest point restores:
// healed). Without the host's record it cannot see a lost newest segment,
// which the store never loses (cmd/s3node).
func OwnScrub(ctx context.Context, st history.Store, db string) (history.ScrubReport, error) {
	keys, err := st.List(ctx, db+"/")
	if err != nil {
		return history.ScrubReport{}, err
	}
	var sh history.Shipped
	for _, k := range keys {
		parts := strings.Split(strings.TrimPrefix(k, db+"/"), "/")
		if len(parts) != 3 || len(parts[0]) != 16 {
			continue
		}
		txid, ok := nameTxid(parts[2])
		if !ok {
			continue
		}
		switch {
		case parts[0] > sh.Gen:
			sh = history.Shipped{Gen: parts[0], Txid: txid, OK: true}
		case parts[0] == sh.Gen:
			sh.Txid = max(sh.Txid, txid)
		}
	}
	return history.NewArchive(st).Scrub(ctx, db, sh, history.ScrubOptions{Sample: -1})
}

// nameTxid is the newest txid an archive object's name names (a
// segment's last, a snapshot's own).
func nameTxid(name string) (uint64, bool) {
	var first, last, t uint64
	if n, err := fmt.Sscanf(name, "%016x-%016x-%016x.seg", &first, &last, &t); err == nil && n == 3 {
		return last, true
	}
	if n, err := fmt.Sscanf(name, "%016x-%016x.snap", &first, &t); err == nil && n == 2 {
		return first, true
	}
	return 0, false
}
