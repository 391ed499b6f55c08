package report

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/failpoint"
	"github.com/shoaldb/shoal/test/robustness/model"
	"github.com/shoaldb/shoal/test/robustness/traffic"
	"github.com/shoaldb/shoal/test/robustness/validate"
)

// skeleton is the structure of a timeline page, read back from its markup:
// what the page shows, not how it looks.
type skeleton struct {
	Title       string
	Command     string
	Porcupine   []string // hrefs
	FaultLanes  []string // kind(target)
	OpLanes     []string // kind cclient ×ops
	NamedBars   []string // data-op of bars linked to their details
	Violations  []string // id → the ops it links, "v-0-1: 3 5"
	NamedRows   []string // op-N rows of the details table
	FaultRows   int
	External    []string // anything that would fetch: src, link, script, non-local href
	AggregateOK bool     // some lane is drawn aggregated
}

func parseTimeline(t *testing.T, page []byte) skeleton {
	t.Helper()
	var s skeleton
	d := xml.NewDecoder(bytes.NewReader(page))
	d.Strict = true
	var stack []xml.StartElement
	var text strings.Builder
	var curViolation string
	attr := func(e xml.StartElement, name string) (string, bool) {
		for _, a := range e.Attr {
			if a.Name.Local == name {
				return a.Value, true
			}
		}
		return "", false
	}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "the page is well-formed markup")
		switch e := tok.(type) {
		case xml.StartElement:
			stack = append(stack, e)
			text.Reset()
			cls, _ := attr(e, "class")
			switch e.Name.Local {
			case "script", "link", "iframe", "img":
				s.External = append(s.External, e.Name.Local)
			}
			if v, ok := attr(e, "src"); ok {
				s.External = append(s.External, "src="+v)
			}
			if href, ok := attr(e, "href"); ok {
				switch {
				case strings.HasPrefix(href, "#"):
				case strings.Contains(href, ":") || strings.HasPrefix(href, "/"):
					s.External = append(s.External, "href="+href)
				}
				if cls == "porcupine" {
					s.Porcupine = append(s.Porcupine, href)
				}
				if curViolation != "" && strings.HasPrefix(href, "#op-") {
					s.Violations[len(s.Violations)-1] += " " + strings.TrimPrefix(href, "#op-")
				}
			}
			switch {
			case cls == "fault-lane":
				k, _ := attr(e, "data-kind")
				tg, _ := attr(e, "data-target")
				s.FaultLanes = append(s.FaultLanes, k+"("+tg+")")
			case cls == "op-lane":
				k, _ := attr(e, "data-kind")
				c, _ := attr(e, "data-client")
				n, _ := attr(e, "data-ops")
				s.OpLanes = append(s.OpLanes, fmt.Sprintf("%s c%s ×%s", k, c, n))
			case strings.Contains(cls, "named") && e.Name.Local == "rect":
				op, _ := attr(e, "data-op")
				parent := stack[len(stack)-2]
				if parent.Name.Local == "a" {
					s.NamedBars = append(s.NamedBars, op)
				}
			case strings.HasPrefix(cls, "agg "):
				s.AggregateOK = true
			case cls == "violation":
				id, _ := attr(e, "id")
				curViolation = id
				s.Violations = append(s.Violations, id+":")
			case cls == "named-op":
				id, _ := attr(e, "id")
				s.NamedRows = append(s.NamedRows, id)
			case cls == "fault-row":
				s.FaultRows++
			}
		case xml.CharData:
			text.Write(e)
		case xml.EndElement:
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			switch {
			case e.Name.Local == "title" && len(stack) > 0 && stack[len(stack)-1].Name.Local == "head":
				s.Title = text.String()
			case e.Name.Local == "code":
				if id, _ := attr(top, "id"); id == "command" {
					s.Command = text.String()
				}
			case e.Name.Local == "li":
				curViolation = ""
			}
		}
	}
	return s
}

const (
	dbA = "0190a1b2-0000-7000-8000-00000000000a"
	dbB = "0190a1b2-0000-7000-8000-00000000000b"
)

// synthetic is a small history with a register that is not linearizable
// (a read misses an acknowledged write), a lost acknowledged row, faults,
// and operations of every outcome.
func synthetic(t *testing.T) *Report {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	ops := []traffic.Op{
		{ID: 0, Client: 1, Kind: traffic.RegWrite, DB: dbA, Value: 1, Outcome: traffic.OK, Call: ms(0), Return: ms(10)},
		{ID: 1, Client: 2, Kind: traffic.RegRead, DB: dbA, Value: 0, Outcome: traffic.OK, Call: ms(20), Return: ms(30)},
		{ID: 2, Client: 3, Kind: traffic.Insert, DB: dbB, Value: 5, Outcome: traffic.OK, Call: ms(25), Return: ms(31)},
		{ID: 3, Client: 3, Kind: traffic.Insert, DB: dbB, Value: 6, Outcome: traffic.Unknown, Call: ms(40), Return: ms(90), Answer: "timeout"},
		{ID: 4, Client: 3, Kind: traffic.Insert, DB: dbB, Value: 7, Outcome: traffic.Failed, Call: ms(95), Return: ms(99), Answer: "503"},
		{ID: 5, Client: 4, Kind: traffic.Create, DB: dbB, Outcome: traffic.OK, Call: ms(1), Return: ms(5)},
		{ID: 6, Client: 5, Kind: traffic.EdgeGet, DB: dbB, Outcome: traffic.OK, Call: ms(26), Return: ms(31)}, // same database, same instant as op 2
	}
	regOps := validate.RegisterOperations(ops)
	reg, info := validate.Linearizable("register", model.Register, regOps, 10*time.Second)
	require.False(t, reg.OK())
	rows := validate.AckedRowsReadable(ops, validate.Final{Rows: map[string]map[int64]bool{dbB: {}}})
	require.False(t, rows.OK())
	return &Report{Scenario: "unit", Seed: 7, Schedule: "short", Ops: ops, Command: "SHOAL_ROBUSTNESS_SEED=7 go test -run '^TestUnit$' ./test/robustness/",
		Results: []validate.Result{reg, rows, {Check: "passing", Checked: 3}},
		Injections: []failpoint.Injection{
			{Failpoint: failpoint.Failpoint{Kind: failpoint.PartitionNode, Target: "n1", Duration: time.Second}, Start: ms(5), Healed: ms(25)},
			{Failpoint: failpoint.Failpoint{Kind: failpoint.KillRestart, Target: "h1", Duration: time.Second}, Start: ms(50), Healed: ms(80), Err: errors.New("heal failed")},
		},
		Visuals: []Visualization{{Name: "register", Model: model.Register, Info: info, Check: reg.Check, Ops: regOps}}}
}

// The page's structure on a synthetic history: the reproduction, one lane
// per fault and per kind and client, every operation a bar, the
// violations linked to the operations they name (porcupine's stuck point:
// the write and the read that missed it; the lost row: its insert), those
// outlined and in the details table, porcupine's page linked, nothing
// fetched from anywhere.
func TestTimelineStructure(t *testing.T) {
	r := synthetic(t)
	got := parseTimeline(t, r.Timeline())
	want := skeleton{
		Title:      "unit seed 7: timeline",
		Command:    r.Command,
		Porcupine:  []string{"register.html"},
		FaultLanes: []string{"partition-node(n1)", "kill-restart(h1)"},
		OpLanes:    []string{"create c4 ×1", "edge-get c5 ×1", "insert c3 ×3", "reg-read c2 ×1", "reg-write c1 ×1"},
		NamedBars:  []string{"2", "1", "0"},
		Violations: []string{"v-0-0: 0 1", "v-1-0: 2"},
		NamedRows:  []string{"op-0", "op-1", "op-2"},
		FaultRows:  2,
	}
	assert.Equal(t, want, got)
}

// At 50,000 operations the page stays small enough to open: lanes past
// timelineDrawEach operations are aggregated, and the operations a
// violation names are still drawn one by one.
func TestTimelineScales(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []traffic.Kind{traffic.RegWrite, traffic.RegRead, traffic.Insert, traffic.Create, traffic.LinGet, traffic.EdgeGet}
	const n, span = 50_000, 120 * time.Second
	var ops []traffic.Op
	for i := range n {
		call := time.Duration(rng.Int64N(int64(span)))
		op := traffic.Op{ID: i, Client: rng.IntN(20), Kind: kinds[rng.IntN(len(kinds))], DB: fmt.Sprintf("0190a1b2-0000-7000-8000-%012d", rng.IntN(40)),
			Value: int64(i), Outcome: traffic.OK, Call: call, Return: call + time.Duration(rng.Int64N(int64(50*time.Millisecond)))}
		if rng.IntN(50) == 0 {
			op.Outcome = traffic.Unknown
			op.Return += 2 * time.Second
		}
		ops = append(ops, op)
	}
	slow := &ops[777] // an acknowledged operation that took 3 s: drawn one by one in its aggregated lane
	slow.Outcome, slow.Return = traffic.OK, slow.Call+3*time.Second
	named := ops[12345]
	r := &Report{Scenario: "scale", Seed: 1, Schedule: "long", Ops: ops,
		Results:    []validate.Result{{Check: "rows", Checked: n, Violations: []string{fmt.Sprintf("%s: value %d acknowledged at %s, not in the table", named.DB, named.Value, named.Return.Round(time.Millisecond))}}},
		Injections: []failpoint.Injection{{Failpoint: failpoint.Failpoint{Kind: failpoint.CatalogCutOff, Duration: 8 * time.Second}, Start: 10 * time.Second, Healed: 18 * time.Second}}}
	page := r.Timeline()
	t.Logf("%d operations, %d lanes: timeline.html is %d bytes", n, len(r.lanes()), len(page))
	assert.Less(t, len(page), 4<<20, "the page stays under 4 MiB at 50,000 operations")
	got := parseTimeline(t, page)
	assert.True(t, got.AggregateOK, "busy lanes are aggregated")
	assert.Contains(t, string(page), fmt.Sprintf(`data-op="%d"`, slow.ID), "a slow operation is drawn one by one")
	assert.Equal(t, []string{fmt.Sprint(named.ID)}, got.NamedBars, "the operation the violation names is drawn and linked")
	assert.Equal(t, []string{"op-" + fmt.Sprint(named.ID)}, got.NamedRows)
	if dir := os.Getenv("SHOAL_TIMELINE_OUT"); dir != "" { // for a look in a browser
		require.NoError(t, os.WriteFile(filepath.Join(dir, "timeline-50k.html"), page, 0o644))
	}
}
