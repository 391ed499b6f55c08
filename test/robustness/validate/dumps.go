package validate

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// The export, import and insights endpoints' checks (traffic.Export,
// traffic.Import and traffic.ImportRead, traffic.Insights).

// possiblyWritten: an insert with this outcome may have written its value
// (acknowledged, or of unknown outcome); the others definitely did not.
func possiblyWritten(o traffic.Outcome) bool { return o == traffic.OK || o == traffic.Unknown }

// ExportsComplete: a successful export holds every insert into its
// database acknowledged before the export started — before its download
// was requested (Op.From), since the dump is read from a snapshot taken
// at the download (edge/export.go) — and no value that no insert into it
// called before the export returned may have written; a 200 dump is
// whole (Op.Malformed: truncated or unparsable is a violation, never a
// success); a failed export failed with a D1-style error (or no HTTP
// answer at all: a transport error, a transfer cut short).
func ExportsComplete(ops []traffic.Op) Result {
	r := Result{Check: "exports hold every insert acknowledged before them and nothing never written; failures are D1-style errors"}
	inserts := map[string][]traffic.Op{}
	for _, op := range ops {
		if op.Kind == traffic.Insert {
			inserts[op.DB] = append(inserts[op.DB], op)
		}
	}
	outcomes := map[traffic.Outcome]int{}
	rows := 0
	for _, op := range ops {
		if op.Kind != traffic.Export {
			continue
		}
		r.Checked++
		outcomes[op.Outcome]++
		if op.Malformed != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("export of %s at %s (%s): %s", op.DB, op.Call.Round(time.Millisecond), op.Outcome, op.Malformed))
			continue
		}
		if op.Outcome != traffic.OK {
			continue
		}
		from := op.From
		if from == 0 {
			from = op.Call
		}
		have := make(map[int64]bool, len(op.Values))
		for _, v := range op.Values {
			have[v] = true
		}
		rows += len(op.Values)
		attempted := map[int64]bool{}
		var missing []traffic.Op
		for _, in := range inserts[op.DB] {
			if in.Outcome == traffic.OK && in.Return < from && !have[in.Value] {
				missing = append(missing, in)
			}
			if in.Call < op.Return && possiblyWritten(in.Outcome) {
				attempted[in.Value] = true
			}
		}
		if len(missing) > 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("export of %s (called at %s, downloaded from %s) lacks %d acknowledged inserts, first value %d acknowledged at %s",
				op.DB, op.Call.Round(time.Millisecond), from.Round(time.Millisecond), len(missing), missing[0].Value, missing[0].Return.Round(time.Millisecond)))
		}
		for _, v := range op.Values {
			if !attempted[v] {
				r.Violations = append(r.Violations, fmt.Sprintf("export of %s (called at %s) holds value %d, which no insert into it may have written", op.DB, op.Call.Round(time.Millisecond), v))
			}
		}
	}
	r.Note = fmt.Sprintf("outcomes %s; %d rows exported", outcomeCounts(outcomes), rows)
	sort.Strings(r.Violations)
	return r
}

// ImportsAtomic: an import reported complete has exactly its rows (a read
// of table imp after it returned shows every row of the dump and nothing
// else); a failed one (refused, or a job that ended in error) left nothing
// visible — no table imp, not even empty; one of unknown outcome left all
// or nothing. Every error on the way is D1-style (Op.Malformed).
func ImportsAtomic(ops []traffic.Op) Result {
	r := Result{Check: "imports all or nothing: complete shows exactly the imported rows, failed shows no table; failures are D1-style errors"}
	imports := map[string][]traffic.Op{}
	outcomes := map[traffic.Outcome]int{}
	for _, op := range ops {
		if op.Kind != traffic.Import {
			continue
		}
		r.Checked++
		outcomes[op.Outcome]++
		imports[op.DB] = append(imports[op.DB], op)
		if op.Malformed != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("import into %s at %s (%s): %s", op.DB, op.Call.Round(time.Millisecond), op.Outcome, op.Malformed))
		}
	}
	reads := 0
	for _, rd := range ops {
		if rd.Kind != traffic.ImportRead || rd.Outcome != traffic.OK {
			continue
		}
		// The import this read follows: the last one returned before it.
		var imp *traffic.Op
		for i := range imports[rd.DB] {
			if op := &imports[rd.DB][i]; op.Return <= rd.Call && (imp == nil || op.Return > imp.Return) {
				imp = op
			}
		}
		if imp == nil {
			continue
		}
		reads++
		r.Checked++
		exact := rd.Found && sameValues(rd.Values, imp.Values)
		what := "no table imp"
		if rd.Found {
			what = fmt.Sprintf("table imp with %d rows", len(rd.Values))
		}
		switch {
		case imp.Outcome == traffic.OK && strings.HasPrefix(imp.Answer, traffic.ImportArchivePending):
			// Applied on the host, archive pending: all or nothing (the
			// host may be lost before the archive caught up).
			if rd.Found && !exact {
				r.Violations = append(r.Violations, fmt.Sprintf("import into %s reported complete with its archiving pending at %s (%d rows), read at %s shows a partial import, %s", rd.DB, imp.Return.Round(time.Millisecond), len(imp.Values), rd.Call.Round(time.Millisecond), what))
			}
		case imp.Outcome == traffic.OK:
			if !exact {
				r.Violations = append(r.Violations, fmt.Sprintf("import into %s reported complete at %s (%d rows), read at %s shows %s", rd.DB, imp.Return.Round(time.Millisecond), len(imp.Values), rd.Call.Round(time.Millisecond), what))
			}
		case imp.Outcome == traffic.Unknown:
			if rd.Found && !exact {
				r.Violations = append(r.Violations, fmt.Sprintf("import into %s of unknown outcome (returned at %s, %d rows): read at %s shows a partial import, %s", rd.DB, imp.Return.Round(time.Millisecond), len(imp.Values), rd.Call.Round(time.Millisecond), what))
			}
		default:
			if rd.Found {
				r.Violations = append(r.Violations, fmt.Sprintf("import into %s failed (%s at %s: %s), read at %s shows %s", rd.DB, imp.Outcome, imp.Return.Round(time.Millisecond), imp.Answer, rd.Call.Round(time.Millisecond), what))
			}
		}
	}
	r.Note = fmt.Sprintf("outcomes %s; %d reads after them", outcomeCounts(outcomes), reads)
	sort.Strings(r.Violations)
	return r
}

// sameValues reports whether a and b hold the same values (each once).
func sameValues(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// InsightsAnswered: every insights request was answered in the v4
// envelope — the shapes, or a D1-style error (a 503 while the analytics
// store is unreachable) — never a crash or a 5xx without the envelope.
func InsightsAnswered(ops []traffic.Op) Result {
	r := Result{Check: "insights answered, or a D1-style error"}
	outcomes := map[traffic.Outcome]int{}
	for _, op := range ops {
		if op.Kind != traffic.Insights {
			continue
		}
		r.Checked++
		outcomes[op.Outcome]++
		if op.Malformed != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("insights of %s at %s (%s): %s", op.DB, op.Call.Round(time.Millisecond), op.Outcome, op.Malformed))
		}
	}
	r.Note = "outcomes " + outcomeCounts(outcomes)
	sort.Strings(r.Violations)
	return r
}

// DumpsAvailableDuring: every export, import (and the read after it) and
// insights request to an existing database called inside one of windows
// succeeded — during a catalog cut-off they route through the route cache
// and the object hosts (edge/DESIGN.md, "Which endpoints route through
// the object hosts"). A database exists if its create was acknowledged
// before the window opened.
func DumpsAvailableDuring(what string, ops []traffic.Op, windows []Window) Result {
	return available("100% of exports, imports and insights to existing databases succeed while "+what,
		[]traffic.Kind{traffic.Export, traffic.Import, traffic.ImportRead, traffic.Insights}, ops, windows)
}

// outcomeCounts is "ok 3, unknown 1" in a stable order.
func outcomeCounts(n map[traffic.Outcome]int) string {
	if len(n) == 0 {
		return "none"
	}
	var ks []string
	for k := range n {
		ks = append(ks, string(k))
	}
	sort.Strings(ks)
	s := ""
	for i, k := range ks {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d", k, n[traffic.Outcome(k)])
	}
	return s
}
