package report

import (
	"fmt"
	"hash/fnv"
	"html"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shoaldb/shoal/test/robustness/traffic"
	"github.com/shoaldb/shoal/test/robustness/validate"
)

// The timeline page (timeline.html) is one self-contained file: inline CSS
// and SVG, no script and nothing fetched, so it opens from a CI artifact
// or a mail attachment as it is. It shows the run on one time axis:
//
//   - one lane per fault (start to heal, kind and target, its error);
//   - one lane per operation kind and client, each operation a bar from
//     its call to its return, coloured by outcome;
//   - the operations a violation names, outlined and linked to a table of
//     their details; each violation links to them.
//
// It stays usable at 50,000 operations (TestTimelineScales: the file's
// size is measured there): past timelineDrawAll operations in all, every
// lane with more than timelineDrawEach is drawn aggregated — the axis cut
// into timelineBuckets columns, each coloured by the worst outcome called
// in it, and neighbouring columns of one colour merged into one bar — with
// failed, unknown and slow (timelineSlow or longer) operations still drawn
// one by one (the first timelineDrawOdd of the page), and the operations a
// violation names always drawn.
const (
	timelineWidth    = 1400 // px of the time axis
	timelineLabel    = 190  // px of the lane labels
	timelineBuckets  = 700  // columns of an aggregated lane
	timelineDrawAll  = 4000 // up to this many operations, every one is drawn
	timelineDrawEach = 40   // past timelineDrawAll, a lane with more operations is aggregated
	timelineDrawOdd  = 2000 // failed, unknown and slow operations drawn one by one in aggregated lanes
	timelineSlow     = time.Second
	timelineNamedCap = 50   // operations linked per violation
	timelineTableCap = 2000 // operations in the details table
)

// outcomeRank orders outcomes by how much they matter on the page: an
// aggregated column shows its worst.
var outcomeRank = map[traffic.Outcome]int{traffic.OK: 0, traffic.NotFound: 1, traffic.Limited: 1, traffic.Refused: 2, traffic.Failed: 3, traffic.Unknown: 4}

// namedOps is, per failed check and violation, the history operations the
// violation names (IDs), and whether the list was cut at timelineNamedCap.
type namedOps struct {
	check     int // index in r.Results
	violation int
	ids       []int
	more      int
}

var (
	uuidRE  = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	valueRE = regexp.MustCompile(`value (-?\d+)`)
	atRE    = regexp.MustCompile(`\bat ((?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?(?:ms|s))\b`)
)

// violationOps finds the operations a violation names. Violations are
// text (validate.Result), so they are read for what they name: the
// databases (UUIDs), narrowed to the value ("value N") and the instant
// ("at 1.234s", an operation's call or return to the millisecond) when the
// text names one and some operation matches. A linearizability check that
// failed names, per database porcupine could not linearize, the
// operations at which its search got stuck (stuckOps).
func (r *Report) violationOps(byID map[int]int) []namedOps {
	var out []namedOps
	for ci, res := range r.Results {
		var stuck []int
		for _, v := range r.Visuals {
			if v.Check != "" && v.Check == res.Check {
				stuck = append(stuck, r.stuckOps(v, byID)...)
			}
		}
		for vi, text := range res.Violations {
			var ids []int
			if dbs := uuidRE.FindAllString(text, -1); len(dbs) > 0 {
				ids = r.opsOf(dbs, text)
			}
			if strings.Contains(text, "not linearizable") {
				ids = append(ids, stuck...)
			}
			n := namedOps{check: ci, violation: vi, ids: ids}
			if len(n.ids) > timelineNamedCap {
				n.more = len(n.ids) - timelineNamedCap
				n.ids = n.ids[:timelineNamedCap]
			}
			out = append(out, n)
		}
	}
	return out
}

func (r *Report) opsOf(dbs []string, text string) []int {
	want := map[string]bool{}
	for _, d := range dbs {
		want[d] = true
	}
	var cand []traffic.Op
	for _, op := range r.Ops {
		if want[op.DB] {
			cand = append(cand, op)
		}
	}
	narrow := func(keep func(traffic.Op) bool) {
		var n []traffic.Op
		for _, op := range cand {
			if keep(op) {
				n = append(n, op)
			}
		}
		if len(n) > 0 {
			cand = n
		}
	}
	if m := valueRE.FindStringSubmatch(text); m != nil {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		narrow(func(op traffic.Op) bool { return op.Value == v })
	}
	if m := atRE.FindStringSubmatch(text); m != nil {
		if at, err := time.ParseDuration(m[1]); err == nil {
			near := func(d time.Duration) bool { return (d - at).Abs() <= time.Millisecond }
			narrow(func(op traffic.Op) bool { return near(op.Call) || near(op.Return) })
		}
	}
	ids := make([]int, len(cand))
	for i, op := range cand {
		ids[i] = op.ID
	}
	return ids
}

// stuckOps: for each database (porcupine partition) whose longest partial
// linearization does not cover its operations, the last operation it
// placed and the operations it could not place that were called before
// the first of them returned — the point porcupine could not get past.
func (r *Report) stuckOps(v Visualization, byID map[int]int) []int {
	dbOf := func(meta any) (string, int, bool) {
		id, ok := meta.(validate.OpID)
		if !ok {
			return "", 0, false
		}
		i, ok := byID[int(id)]
		if !ok {
			return "", 0, false
		}
		return r.Ops[i].DB, int(id), true
	}
	type span struct {
		id        int
		call, ret int64
	}
	all := map[string][]span{}
	for _, o := range v.Ops {
		if db, id, ok := dbOf(o.Metadata); ok {
			all[db] = append(all[db], span{id, o.Call, o.Return})
		}
	}
	longest := map[string][]span{}
	for _, part := range v.Info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) == 0 {
				continue
			}
			db, _, ok := dbOf(lin[0].Metadata)
			if !ok || len(lin) <= len(longest[db]) {
				continue
			}
			var s []span
			for _, o := range lin {
				if _, id, ok := dbOf(o.Metadata); ok {
					s = append(s, span{id, o.Call, o.Return})
				}
			}
			longest[db] = s
		}
	}
	dbs := make([]string, 0, len(all))
	for db := range all {
		dbs = append(dbs, db)
	}
	sort.Strings(dbs)
	var out []int
	for _, db := range dbs {
		ops, placed := all[db], longest[db]
		if len(placed) >= len(ops) {
			continue
		}
		// A list projects onto many databases with one ID: count by
		// (id, call, return), not by id alone.
		done := map[span]int{}
		for _, s := range placed {
			done[s]++
		}
		var left []span
		for _, s := range ops {
			if done[s] > 0 {
				done[s]--
				continue
			}
			left = append(left, s)
		}
		if len(left) == 0 {
			continue
		}
		first := left[0].ret
		for _, s := range left {
			first = min(first, s.ret)
		}
		if len(placed) > 0 {
			out = append(out, placed[len(placed)-1].id)
		}
		for _, s := range left {
			if s.call <= first {
				out = append(out, s.id)
			}
		}
	}
	return out
}

// lane is one row of operations: one kind, one client.
type lane struct {
	kind   traffic.Kind
	client int
	ops    []int // indexes in r.Ops, by call
}

func (r *Report) lanes() []lane {
	idx := map[[2]string]int{}
	var out []lane
	for i, op := range r.Ops {
		k := [2]string{string(op.Kind), strconv.Itoa(op.Client)}
		j, ok := idx[k]
		if !ok {
			j = len(out)
			idx[k] = j
			out = append(out, lane{kind: op.Kind, client: op.Client})
		}
		out[j].ops = append(out[j].ops, i)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].kind != out[b].kind {
			return out[a].kind < out[b].kind
		}
		return out[a].client < out[b].client
	})
	for _, l := range out {
		sort.SliceStable(l.ops, func(a, b int) bool { return r.Ops[l.ops[a]].Call < r.Ops[l.ops[b]].Call })
	}
	return out
}

// Timeline renders the page (see the comment on the constants above).
// porcupine pages are linked as NAME.html beside it.
func (r *Report) Timeline() []byte {
	byID := make(map[int]int, len(r.Ops))
	for i, op := range r.Ops {
		byID[op.ID] = i
	}
	named := r.violationOps(byID)
	highlighted := map[int]bool{}
	for _, n := range named {
		for _, id := range n.ids {
			highlighted[id] = true
		}
	}

	// The time axis: from 0 to the last return or heal.
	var end time.Duration
	for _, op := range r.Ops {
		end = max(end, op.Return, op.Call)
	}
	for _, inj := range r.Injections {
		end = max(end, inj.Healed, inj.Start)
	}
	if end <= 0 {
		end = time.Second
	}
	x := func(d time.Duration) float64 {
		return timelineLabel + float64(max(0, min(d, end)))/float64(end)*timelineWidth
	}

	var b strings.Builder
	esc := html.EscapeString
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\n")
	fmt.Fprintf(&b, "<title>%s seed %d: timeline</title>\n", esc(r.Scenario), r.Seed)
	b.WriteString(`<style>
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px}h2{font-size:15px;margin-top:24px}
code,pre{font:12px ui-monospace,monospace}pre{background:#f6f6f6;padding:8px;overflow:auto}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;font-size:12px}
tr:target{background:#fff3a8}
.legend span{display:inline-block;margin-right:12px}.legend i{display:inline-block;width:12px;height:10px;margin-right:4px;vertical-align:middle}
svg text{font:11px system-ui,sans-serif}
.ok{fill:#8fbf8f}.not-found,.limited{fill:#9ab4d8}.refused{fill:#c9a0dc}.failed{fill:#f0a35e}.unknown{fill:#d9534f}
.named{stroke:#000;stroke-width:1.5px}
.fault{fill-opacity:.85}.band{fill:#f4b6b6;fill-opacity:.18}
.grid{stroke:#ccc;stroke-width:1}
</style></head><body>
`)
	fmt.Fprintf(&b, "<h1>%s — seed %d, schedule %s</h1>\n", esc(r.Scenario), r.Seed, esc(r.Schedule))
	fmt.Fprintf(&b, "<p>Reproduce: <code id=\"command\">%s</code></p>\n", esc(r.command()))
	verdict := "passed"
	if r.Failed() {
		verdict = "FAILED"
	}
	fmt.Fprintf(&b, "<p>Verdict: <b>%s</b>; %d operations, %d faults, the axis %s long.", verdict, len(r.Ops), len(r.Injections), ms(end))
	if len(r.Visuals) > 0 {
		b.WriteString(" porcupine's visualizations:")
		for _, v := range r.Visuals {
			fmt.Fprintf(&b, " <a class=\"porcupine\" href=\"%s.html\">%s</a>", esc(v.Name), esc(v.Name))
		}
	}
	b.WriteString(" The text summary is <a href=\"summary.txt\">summary.txt</a>, every operation <a href=\"history.jsonl\">history.jsonl</a>.</p>\n")

	// Violations, each linked to the operations it names.
	b.WriteString("<h2>Violations</h2>\n")
	nv := 0
	for _, n := range named {
		res := r.Results[n.check]
		if n.violation == 0 {
			if nv > 0 {
				b.WriteString("</ul>\n")
			}
			fmt.Fprintf(&b, "<h3 class=\"check\">%s: %d of %d checked</h3>\n<ul>\n", esc(res.Check), len(res.Violations), res.Checked)
		}
		nv++
		fmt.Fprintf(&b, "<li class=\"violation\" id=\"v-%d-%d\">%s", n.check, n.violation, esc(res.Violations[n.violation]))
		if len(n.ids) > 0 {
			b.WriteString(" — operations:")
			for _, id := range n.ids {
				fmt.Fprintf(&b, " <a href=\"#op-%d\">%d</a>", id, id)
			}
			if n.more > 0 {
				fmt.Fprintf(&b, " and %d more", n.more)
			}
		}
		b.WriteString("</li>\n")
	}
	if nv > 0 {
		b.WriteString("</ul>\n")
	} else {
		b.WriteString("<p>None.</p>\n")
	}
	for _, inj := range r.Injections {
		if inj.Err != nil {
			fmt.Fprintf(&b, "<p class=\"fault-error\">Fault %s: %s</p>\n", esc(inj.Failpoint.String()), esc(inj.Err.Error()))
		}
	}

	// The picture.
	lanes := r.lanes()
	const rowH, faultH, axisH = 14, 16, 24
	height := axisH + len(r.Injections)*faultH + 8 + len(lanes)*rowH + 8
	b.WriteString("<h2>Timeline</h2>\n<p class=\"legend\">")
	for _, o := range []traffic.Outcome{traffic.OK, traffic.NotFound, traffic.Refused, traffic.Failed, traffic.Unknown} {
		label := string(o)
		if o == traffic.NotFound {
			label = "not-found / limited"
		}
		fmt.Fprintf(&b, "<span><i class=\"%s\" style=\"background:%s\"></i>%s</span>", o, outcomeColour(o), label)
	}
	b.WriteString("<span><i style=\"border:1.5px solid #000\"></i>named by a violation (click: its details)</span>")
	if len(r.Ops) > timelineDrawAll {
		fmt.Fprintf(&b, "<span>Lanes with more than %d operations are aggregated: each column shows the worst outcome called in it, hover for counts; failed, unknown and slow (%s or longer) operations are drawn one by one (the first %d), and so is every operation a violation names.</span>", timelineDrawEach, timelineSlow, timelineDrawOdd)
	}
	b.WriteString("</p>\n")
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n", timelineLabel+timelineWidth+10, height, timelineLabel+timelineWidth+10, height)
	// Axis and grid.
	step := tickStep(end)
	for t := time.Duration(0); t <= end; t += step {
		fmt.Fprintf(&b, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/><text x=\"%.1f\" y=\"%d\">%s</text>\n",
			x(t), axisH-6, x(t), height, x(t)+2, axisH-10, t)
	}
	// Fault bands behind everything, then one lane per fault.
	for _, inj := range r.Injections {
		fmt.Fprintf(&b, "<rect class=\"band\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\"/>\n", x(inj.Start), axisH, max(1, x(inj.Healed)-x(inj.Start)), height-axisH)
	}
	y := axisH
	for i, inj := range r.Injections {
		fp := inj.Failpoint
		errText := ""
		if inj.Err != nil {
			errText = "; error: " + inj.Err.Error()
		}
		fmt.Fprintf(&b, "<g class=\"fault-lane\" data-kind=\"%s\" data-target=\"%s\"><text x=\"2\" y=\"%d\">fault %d: %s</text>", esc(string(fp.Kind)), esc(fp.Target), y+12, i+1, esc(string(fp.Kind)))
		fmt.Fprintf(&b, "<rect class=\"fault\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s: %s → %s%s</title></rect>",
			x(inj.Start), y+2, max(1, x(inj.Healed)-x(inj.Start)), faultH-4, kindColour(string(fp.Kind)), esc(fp.String()), ms(inj.Start), ms(inj.Healed), esc(errText))
		fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%d\">%s</text></g>\n", x(inj.Healed)+3, y+12, esc(fp.String()))
		y += faultH
	}
	y += 8
	odd := timelineDrawOdd
	for _, l := range lanes {
		aggregate := len(r.Ops) > timelineDrawAll && len(l.ops) > timelineDrawEach
		r.drawLane(&b, l, y, rowH, x, end, highlighted, aggregate, &odd)
		y += rowH
	}
	b.WriteString("</svg>\n")

	// Faults and named operations in tables.
	b.WriteString("<h2>Faults</h2>\n<table><tr><th>#</th><th>kind</th><th>target</th><th>start</th><th>healed</th><th>failpoint</th><th>error</th></tr>\n")
	for i, inj := range r.Injections {
		e := ""
		if inj.Err != nil {
			e = inj.Err.Error()
		}
		fmt.Fprintf(&b, "<tr class=\"fault-row\"><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
			i+1, esc(string(inj.Failpoint.Kind)), esc(inj.Failpoint.Target), ms(inj.Start), ms(inj.Healed), esc(inj.Failpoint.String()), esc(e))
	}
	b.WriteString("</table>\n<h2>Operations named by violations</h2>\n")
	var ids []int
	for id := range highlighted {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	if len(ids) > timelineTableCap {
		fmt.Fprintf(&b, "<p>The first %d of %d (history.jsonl has every operation).</p>\n", timelineTableCap, len(ids))
		ids = ids[:timelineTableCap]
	}
	b.WriteString("<table><tr><th>op</th><th>kind</th><th>client</th><th>database</th><th>value</th><th>outcome</th><th>call</th><th>return</th><th>answer</th></tr>\n")
	for _, id := range ids {
		i, ok := byID[id]
		if !ok {
			continue
		}
		op := r.Ops[i]
		fmt.Fprintf(&b, "<tr class=\"named-op\" id=\"op-%d\"><td>%d</td><td>%s</td><td>%d</td><td>%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
			op.ID, op.ID, esc(string(op.Kind)), op.Client, esc(op.DB), op.Value, esc(string(op.Outcome)), ms(op.Call), ms(op.Return), esc(op.Answer))
	}
	b.WriteString("</table>\n<h2>Summary</h2>\n<pre>")
	b.WriteString(esc(r.Summary()))
	b.WriteString("</pre>\n</body></html>\n")
	return []byte(b.String())
}

// drawLane draws one lane: every operation as a call→return bar, or
// aggregated columns plus the named operations and the odd ones (failed,
// unknown, slow) while *odd lasts.
func (r *Report) drawLane(b *strings.Builder, l lane, y, h int, x func(time.Duration) float64, end time.Duration, highlighted map[int]bool, aggregate bool, odd *int) {
	esc := html.EscapeString
	fmt.Fprintf(b, "<g class=\"op-lane\" data-kind=\"%s\" data-client=\"%d\" data-ops=\"%d\"><text x=\"2\" y=\"%d\">%s c%d (%d)</text>\n",
		esc(string(l.kind)), l.client, len(l.ops), y+10, esc(string(l.kind)), l.client, len(l.ops))
	bar := func(op traffic.Op) {
		cls := string(op.Outcome)
		if highlighted[op.ID] {
			fmt.Fprintf(b, "<a href=\"#op-%d\">", op.ID)
			cls += " named"
		}
		fmt.Fprintf(b, "<rect class=\"%s\" data-op=\"%d\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\"><title>op %d %s %s %s → %s %s</title></rect>",
			cls, op.ID, x(op.Call), y+2, max(1, x(op.Return)-x(op.Call)), h-4, op.ID, esc(string(op.Kind)), esc(opSubject(op)), ms(op.Call), ms(op.Return), esc(string(op.Outcome)+" "+op.Answer))
		if highlighted[op.ID] {
			b.WriteString("</a>")
		}
		b.WriteString("\n")
	}
	if !aggregate {
		for _, i := range l.ops {
			bar(r.Ops[i])
		}
		b.WriteString("</g>\n")
		return
	}
	// Aggregated: per column, the count by outcome of the operations
	// called in it; neighbouring columns with the same worst outcome are
	// one bar.
	type col struct {
		n     [5]int // by outcomeRank
		worst int
	}
	cols := make([]col, timelineBuckets)
	for _, i := range l.ops {
		op := r.Ops[i]
		c := min(timelineBuckets-1, int(float64(op.Call)/float64(end)*timelineBuckets))
		rk := outcomeRank[op.Outcome]
		cols[c].n[rk]++
		cols[c].worst = max(cols[c].worst, rk)
	}
	names := []string{"ok", "not-found/limited", "refused", "failed", "unknown"}
	colW := float64(timelineWidth) / timelineBuckets
	for c := 0; c < timelineBuckets; {
		if sum(cols[c].n) == 0 {
			c++
			continue
		}
		start, worst := c, cols[c].worst
		var tot [5]int
		for c < timelineBuckets && sum(cols[c].n) > 0 && cols[c].worst == worst {
			for k := range tot {
				tot[k] += cols[c].n[k]
			}
			c++
		}
		var parts []string
		for k, n := range tot {
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", names[k], n))
			}
		}
		from := time.Duration(float64(start) / timelineBuckets * float64(end))
		to := time.Duration(float64(c) / timelineBuckets * float64(end))
		fmt.Fprintf(b, "<rect class=\"agg %s\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill-opacity=\".6\"><title>%s–%s: %s</title></rect>\n",
			rankClass(worst), timelineLabel+float64(start)*colW, y+2, float64(c-start)*colW, h-4, ms(from), ms(to), strings.Join(parts, ", "))
	}
	for _, i := range l.ops {
		op := r.Ops[i]
		switch {
		case highlighted[op.ID]:
			bar(op)
		case (outcomeRank[op.Outcome] >= outcomeRank[traffic.Failed] || op.Return-op.Call >= timelineSlow) && *odd > 0:
			*odd--
			bar(op)
		}
	}
	b.WriteString("</g>\n")
}

func sum(n [5]int) int { return n[0] + n[1] + n[2] + n[3] + n[4] }

func rankClass(rk int) string {
	return [...]string{"ok", "not-found", "refused", "failed", "unknown"}[rk]
}

func outcomeColour(o traffic.Outcome) string {
	switch o {
	case traffic.OK:
		return "#8fbf8f"
	case traffic.NotFound, traffic.Limited:
		return "#9ab4d8"
	case traffic.Refused:
		return "#c9a0dc"
	case traffic.Failed:
		return "#f0a35e"
	}
	return "#d9534f"
}

// kindColour gives each fault kind a stable colour.
func kindColour(kind string) string {
	h := fnv.New32a()
	h.Write([]byte(kind))
	return fmt.Sprintf("hsl(%d,55%%,60%%)", h.Sum32()%360)
}

func opSubject(op traffic.Op) string {
	s := op.DB
	if op.Value != 0 {
		s += fmt.Sprintf(" value %d", op.Value)
	}
	if op.Bookmark != "" {
		s += " bookmark " + op.Bookmark
	}
	switch op.Kind {
	case traffic.Export, traffic.Import, traffic.ImportRead:
		s += fmt.Sprintf(" %d rows", len(op.Values))
	}
	if op.Malformed != "" {
		s += " malformed: " + op.Malformed
	}
	return s
}

// tickStep is a round step giving 8–20 ticks over end.
func tickStep(end time.Duration) time.Duration {
	for _, s := range []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
		10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute} {
		if end/s <= 20 {
			return s
		}
	}
	return 30 * time.Minute
}

// command is how to rerun this run: Report.Command, else the suite's
// generic rerun of the seed.
func (r *Report) command() string {
	if r.Command != "" {
		return r.Command
	}
	return fmt.Sprintf("SHOAL_ROBUSTNESS_SEED=%d go test -count=1 -run Fault -v ./test/robustness/", r.Seed)
}
