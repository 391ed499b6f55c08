package report

import (
	"errors"
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

// A failing run's report is written only when something failed, so this
// test is what shows the writer works: summary, history, visualization with
// the faults drawn on it, logs.
func TestWriteFailingReport(t *testing.T) {
	ops := []traffic.Op{
		{Kind: traffic.RegWrite, DB: "a", Value: 1, Outcome: traffic.OK, Call: 0, Return: 10 * time.Millisecond},
		{Kind: traffic.RegRead, DB: "a", Value: 0, Outcome: traffic.OK, Call: 20 * time.Millisecond, Return: 30 * time.Millisecond, Client: 1},
	}
	res, info := validate.Linearizable("register", model.Register, validate.RegisterOperations(ops), 10*time.Second)
	require.False(t, res.OK())
	r := &Report{Scenario: "unit", Seed: 7, Schedule: "short", Ops: ops, Results: []validate.Result{res},
		Injections: []failpoint.Injection{{Failpoint: failpoint.Failpoint{Kind: failpoint.PartitionNode, Target: "n1", Duration: time.Second},
			Start: 5 * time.Millisecond, Healed: 25 * time.Millisecond, Err: errors.New("heal failed")}},
		Visuals: []Visualization{{Name: "register", Model: model.Register, Info: info}},
		Logs:    map[string]string{"n1": "log line"}}
	assert.True(t, r.Failed())
	s := r.Summary()
	for _, want := range []string{"SHOAL_ROBUSTNESS_SEED=7", "partition-node(n1, 1s)", "heal failed", "VIOLATIONS", "reg-read ok ×1", "reg-read 1, 100%"} {
		assert.Contains(t, s, want)
	}
	dir := t.TempDir()
	files, err := r.Write(dir)
	require.NoError(t, err)
	assert.Len(t, files, 5)
	html, err := os.ReadFile(filepath.Join(dir, "register.html"))
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(html), "partition-node(n1, 1s)"), "the fault is drawn on the visualization")
}
