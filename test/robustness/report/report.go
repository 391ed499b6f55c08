// Package report writes what a robustness run did and found: the seed and
// schedule to reproduce it, the faults on the history's clock, each check's
// verdict, operation counts by kind and outcome, the full history (JSON
// lines), a timeline page of faults and operations on one axis with the
// violations linked to the operations they name (timeline.go), porcupine's
// visualization of each linearizability check with the faults drawn on it,
// and the tail of every process's output.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/shoaldb/shoal/test/robustness/failpoint"
	"github.com/shoaldb/shoal/test/robustness/traffic"
	"github.com/shoaldb/shoal/test/robustness/validate"
)

// Visualization is one porcupine check to draw.
type Visualization struct {
	Name  string
	Model porcupine.Model
	Info  porcupine.LinearizationInfo
	// Check is the validate.Result.Check of this check, and Ops the
	// operations it checked (each with its history op as Metadata,
	// validate.OpID): when it fails, the timeline names the operations at
	// which porcupine got stuck. Both optional.
	Check string
	Ops   []porcupine.Operation
}

// Report is one run.
type Report struct {
	Scenario   string
	Seed       uint64
	Schedule   string
	Injections []failpoint.Injection
	Results    []validate.Result
	Ops        []traffic.Op
	Visuals    []Visualization
	Logs       map[string]string // process name → output tail
	// Command reruns this run (the timeline page shows it); empty: the
	// suite's generic rerun of the seed.
	Command string
}

// Failed reports whether any check found a violation or a fault failed to
// inject or heal.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if !res.OK() {
			return true
		}
	}
	for _, inj := range r.Injections {
		if inj.Err != nil {
			return true
		}
	}
	return false
}

// Summary is the text a failing test prints: reproduction, timeline,
// verdicts, counts.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s, seed %d (rerun: SHOAL_ROBUSTNESS_SEED=%d), schedule %s\n", r.Scenario, r.Seed, r.Seed, r.Schedule)
	if r.Command != "" {
		fmt.Fprintf(&b, "rerun: %s\n", r.Command)
	}
	b.WriteString("faults:\n")
	for _, inj := range r.Injections {
		fmt.Fprintf(&b, "  %8s → %8s  %s", ms(inj.Start), ms(inj.Healed), inj.Failpoint)
		if inj.Err != nil {
			fmt.Fprintf(&b, "  ERROR: %v", inj.Err)
		}
		b.WriteString("\n")
	}
	b.WriteString("operations called during each fault (success %, p99 latency):\n")
	for _, inj := range r.Injections {
		fmt.Fprintf(&b, "  %s: %s\n", inj.Failpoint, availability(r.Ops, inj.Start, inj.Healed))
	}
	b.WriteString("checks:\n")
	for _, res := range r.Results {
		b.WriteString("  " + res.String() + "\n")
	}
	b.WriteString("operations (kind outcome ×count):\n  " + strings.Join(counts(r.Ops), "\n  ") + "\n")
	return b.String()
}

// Write writes the report into dir (created): summary.txt, history.jsonl,
// timeline.html (Timeline: faults and operations on one axis, the
// violations linked to the operations they name), one porcupine HTML per
// visualization, one log file per process. It returns the files written.
func (r *Report) Write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	write := func(name string, data []byte) error {
		p := filepath.Join(dir, name)
		files = append(files, p)
		return os.WriteFile(p, data, 0o644)
	}
	if err := write("summary.txt", []byte(r.Summary())); err != nil {
		return files, err
	}
	var hist strings.Builder
	enc := json.NewEncoder(&hist)
	for _, op := range r.Ops {
		if err := enc.Encode(op); err != nil {
			return files, err
		}
	}
	if err := write("history.jsonl", []byte(hist.String())); err != nil {
		return files, err
	}
	if err := write("timeline.html", r.Timeline()); err != nil {
		return files, err
	}
	for _, v := range r.Visuals {
		v.Info.AddAnnotations(r.annotations())
		p := filepath.Join(dir, v.Name+".html")
		files = append(files, p)
		if err := porcupine.VisualizePath(v.Model, v.Info, p); err != nil {
			return files, fmt.Errorf("visualize %s: %w", v.Name, err)
		}
	}
	for name, log := range r.Logs {
		if err := write(name+".log", []byte(log)); err != nil {
			return files, err
		}
	}
	return files, nil
}

// annotations draw each fault as a span on a "faults" row.
func (r *Report) annotations() []porcupine.Annotation {
	var out []porcupine.Annotation
	for _, inj := range r.Injections {
		out = append(out, porcupine.Annotation{Tag: "faults", Start: int64(inj.Start), End: int64(inj.Healed),
			Description: inj.Failpoint.String(), BackgroundColor: "#f4b6b6"})
	}
	return out
}

// answered reports whether op got the definite answer the system owes it:
// acknowledged, a definite not-found, or — for a free account over its
// daily row limit — the limit's refusal (the behaviour the limit checks
// require, not an outage).
func answered(op traffic.Op) bool {
	return op.Outcome == traffic.OK || op.Outcome == traffic.NotFound || op.Outcome == traffic.Limited
}

// availability summarises, by kind, the operations called in [from, to].
func availability(ops []traffic.Op, from, to time.Duration) string {
	type agg struct {
		n, ok int
		lat   []time.Duration
	}
	by := map[traffic.Kind]*agg{}
	for _, op := range ops {
		if op.Call < from || op.Call > to {
			continue
		}
		a := by[op.Kind]
		if a == nil {
			a = &agg{}
			by[op.Kind] = a
		}
		a.n++
		if answered(op) {
			a.ok++
		}
		a.lat = append(a.lat, op.Return-op.Call)
	}
	var parts []string
	for k, a := range by {
		sort.Slice(a.lat, func(i, j int) bool { return a.lat[i] < a.lat[j] })
		p99 := a.lat[min(len(a.lat)-1, len(a.lat)*99/100)]
		parts = append(parts, fmt.Sprintf("%s %d, %.0f%%, p99 %s", k, a.n, 100*float64(a.ok)/float64(a.n), ms(p99)))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "no operations"
	}
	return strings.Join(parts, "; ")
}

func counts(ops []traffic.Op) []string {
	n := map[string]int{}
	for _, op := range ops {
		n[fmt.Sprintf("%s %s", op.Kind, op.Outcome)]++
	}
	var out []string
	for k, c := range n {
		out = append(out, fmt.Sprintf("%s ×%d", k, c))
	}
	sort.Strings(out)
	return out
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }
