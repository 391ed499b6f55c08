package report

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/shoaldb/shoal/test/robustness/traffic"
)

// Record is one run in machine-readable form: one JSON line per run in the
// file $SHOAL_ROBUSTNESS_RESULTS names, from which docs/reliability.md's
// tables are made (Table).
type Record struct {
	Scenario   string         `json:"scenario"`
	Schedule   string         `json:"schedule"`
	Seed       uint64         `json:"seed"`
	Date       string         `json:"date"`
	Operations int            `json:"operations"`
	Faults     []FaultRecord  `json:"faults"`
	Checks     map[string]int `json:"checks"`     // check → items checked
	Violations map[string]int `json:"violations"` // check → violations (only failing checks)
	Errors     []string       `json:"errors,omitempty"`
}

// FaultRecord is one injection and the operations called while it lasted.
type FaultRecord struct {
	Kind   string              `json:"kind"`
	Target string              `json:"target"`
	Ms     int64               `json:"ms"`
	Ops    map[string]OpFigure `json:"ops"` // operation kind → figures
}

// OpFigure counts the operations of one kind called during a fault.
type OpFigure struct {
	N     int   `json:"n"`
	OK    int   `json:"ok"` // answered: acknowledged, a definite not-found, or a daily-limit refusal
	P99Ms int64 `json:"p99_ms"`
}

// Record builds the run's record.
func (r *Report) Record() Record {
	rec := Record{Scenario: r.Scenario, Schedule: r.Schedule, Seed: r.Seed, Date: time.Now().UTC().Format(time.DateOnly),
		Operations: len(r.Ops), Checks: map[string]int{}, Violations: map[string]int{}}
	for _, inj := range r.Injections {
		fr := FaultRecord{Kind: string(inj.Failpoint.Kind), Target: inj.Failpoint.Target, Ms: (inj.Healed - inj.Start).Milliseconds(), Ops: figures(r.Ops, inj.Start, inj.Healed)}
		rec.Faults = append(rec.Faults, fr)
		if inj.Err != nil {
			rec.Errors = append(rec.Errors, inj.Err.Error())
		}
	}
	for _, res := range r.Results {
		rec.Checks[res.Check] = res.Checked
		if !res.OK() {
			rec.Violations[res.Check] = len(res.Violations)
		}
	}
	return rec
}

func figures(ops []traffic.Op, from, to time.Duration) map[string]OpFigure {
	lat := map[traffic.Kind][]time.Duration{}
	out := map[string]OpFigure{}
	for _, op := range ops {
		if op.Call < from || op.Call > to {
			continue
		}
		f := out[string(op.Kind)]
		f.N++
		if answered(op) {
			f.OK++
		}
		out[string(op.Kind)] = f
		lat[op.Kind] = append(lat[op.Kind], op.Return-op.Call)
	}
	for k, l := range lat {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		f := out[string(k)]
		f.P99Ms = l[min(len(l)-1, len(l)*99/100)].Milliseconds()
		out[string(k)] = f
	}
	return out
}

// AppendRecord appends the run's record as one JSON line to path.
func (r *Report) AppendRecord(path string) error {
	b, err := json.Marshal(r.Record())
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Table renders records as docs/reliability.md's tables: runs and
// violations, then per fault kind the injections and the success % and p99
// of each operation kind called during them.
func Table(recs []Record) string {
	var b strings.Builder
	ops, faults := 0, 0
	viol := map[string]int{}
	checked := map[string]int{}
	type agg struct {
		n, ok int
		p99   []int64
	}
	byFault := map[string]map[string]*agg{}
	injections := map[string]int{}
	for _, rec := range recs {
		ops += rec.Operations
		faults += len(rec.Faults)
		for c, n := range rec.Checks {
			checked[c] += n
		}
		for c, n := range rec.Violations {
			viol[c] += n
		}
		for _, f := range rec.Faults {
			injections[f.Kind]++
			if byFault[f.Kind] == nil {
				byFault[f.Kind] = map[string]*agg{}
			}
			for k, fig := range f.Ops {
				a := byFault[f.Kind][k]
				if a == nil {
					a = &agg{}
					byFault[f.Kind][k] = a
				}
				a.n += fig.N
				a.ok += fig.OK
				a.p99 = append(a.p99, fig.P99Ms)
			}
		}
	}
	fmt.Fprintf(&b, "%d runs, %d operations checked, %d faults injected.\n\n", len(recs), ops, faults)
	b.WriteString("| check | items checked | violations |\n|---|---|---|\n")
	var cs []string
	for c := range checked {
		cs = append(cs, c)
	}
	sort.Strings(cs)
	for _, c := range cs {
		fmt.Fprintf(&b, "| %s | %d | %d |\n", c, checked[c], viol[c])
	}
	b.WriteString("\n| fault | injections | operation: calls, success %, worst per-injection p99 |\n|---|---|---|\n")
	var ks []string
	for k := range byFault {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		var parts []string
		var opk []string
		for o := range byFault[k] {
			opk = append(opk, o)
		}
		sort.Strings(opk)
		for _, o := range opk {
			a := byFault[k][o]
			worst := int64(0)
			for _, p := range a.p99 {
				worst = max(worst, p)
			}
			pct := 0.0
			if a.n > 0 {
				pct = 100 * float64(a.ok) / float64(a.n)
			}
			parts = append(parts, fmt.Sprintf("%s %d, %.1f%%, %d ms", o, a.n, pct, worst))
		}
		fmt.Fprintf(&b, "| %s | %d | %s |\n", k, injections[k], strings.Join(parts, "; "))
	}
	return b.String()
}
