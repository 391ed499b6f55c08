package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/pipeline/chsink"
	"github.com/shoaldb/shoal/pipeline/snapshot"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// usageTruth is what the edge answered: per account, requests and the rows
// its meta reported read and written.
type usageTruth struct {
	mu   sync.Mutex
	acct map[string]*chsink.Totals
}

func (u *usageTruth) add(acct string, rowsRead, rowsWritten int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	tt := u.acct[acct]
	if tt == nil {
		tt = &chsink.Totals{}
		u.acct[acct] = tt
	}
	tt.Queries++
	tt.RowsRead += rowsRead
	tt.RowsWritten += rowsWritten
}

// pipelineTraffic sends queries to every database through the edge and
// records what each answer reported.
type pipelineTraffic struct {
	c      *harness.PipelineCluster
	dbs    []harness.PipelineDB
	truth  *usageTruth
	mu     sync.Mutex
	failed []string
	sent   int
}

func (w *pipelineTraffic) query(db harness.PipelineDB, sql string) {
	a, err := harness.Try(http.MethodPost, w.c.EdgeURL+"/client/v4/accounts/"+db.Acct+"/d1/database/"+db.UUID+"/query",
		"Bearer "+db.Token, map[string]any{"sql": sql})
	w.mu.Lock()
	w.sent++
	w.mu.Unlock()
	if err != nil || a.Status != http.StatusOK {
		w.mu.Lock()
		if len(w.failed) < 10 {
			w.failed = append(w.failed, harness.AnswerText(a, err))
		}
		w.mu.Unlock()
		return
	}
	var results []struct {
		Meta struct {
			RowsRead    int64 `json:"rows_read"`
			RowsWritten int64 `json:"rows_written"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(a.Result, &results); err != nil {
		w.mu.Lock()
		w.failed = append(w.failed, "undecodable result: "+string(a.Raw))
		w.mu.Unlock()
		return
	}
	var r, wr int64
	for _, s := range results {
		r += s.Meta.RowsRead
		wr += s.Meta.RowsWritten
	}
	w.truth.add(db.Acct, r, wr)
}

// run sends queries from workers until stop is closed.
func (w *pipelineTraffic) run(workers int, stop <-chan struct{}) (wait func()) {
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				db := w.dbs[rng.IntN(len(w.dbs))]
				if n%3 == 0 {
					w.query(db, fmt.Sprintf("INSERT INTO t(v) VALUES (%d), (%d)", n, n+1))
				} else {
					w.query(db, "SELECT count(*), sum(v) FROM t WHERE v > "+strconv.Itoa(rng.IntN(50)))
				}
				time.Sleep(2 * time.Millisecond) // pacing: a load generator against real processes
			}
		}()
	}
	return wg.Wait
}

// TestPipelineUsageExactThroughFaults: queries through the edge land in
// ClickHouse exactly — every account's query count and rows read and
// written equal what the edge answered — although, while queries keep
// coming, the broker is closed and restarted on its data, the pipeline
// role (the ClickHouse sink) is killed with SIGKILL mid-stream and
// restarted, and ClickHouse is down for 30 s. No query fails meanwhile:
// the query path never waits on the plane.
func TestPipelineUsageExactThroughFaults(t *testing.T) {
	c := harness.NewPipelineCluster(t, shoalBin.Path(t))
	w := &pipelineTraffic{c: c, truth: &usageTruth{acct: map[string]*chsink.Totals{}}}
	for a := range 4 {
		acct := harness.Call(t, http.MethodPost, c.EdgeURL+"/admin/v1/accounts", "Bearer "+c.Admin, map[string]any{"name": fmt.Sprintf("acct-%d", a), "tier": "paid"})
		require.Equal(t, http.StatusOK, acct.Status, "%s", acct.Raw)
		var ac struct{ ID string }
		require.NoError(t, json.Unmarshal(acct.Result, &ac))
		tok := harness.Call(t, http.MethodPost, c.EdgeURL+"/admin/v1/accounts/"+ac.ID+"/tokens", "Bearer "+c.Admin, map[string]any{"name": "t"})
		require.Equal(t, http.StatusOK, tok.Status, "%s", tok.Raw)
		var tk struct{ Token string }
		require.NoError(t, json.Unmarshal(tok.Result, &tk))
		for d := range 3 {
			cr := harness.Call(t, http.MethodPost, c.EdgeURL+"/client/v4/accounts/"+ac.ID+"/d1/database", "Bearer "+tk.Token, map[string]any{"name": fmt.Sprintf("db-%d", d)})
			require.Equal(t, http.StatusOK, cr.Status, "%s", cr.Raw)
			var db struct{ UUID string }
			require.NoError(t, json.Unmarshal(cr.Result, &db))
			pdb := harness.PipelineDB{Acct: ac.ID, Token: tk.Token, UUID: db.UUID}
			w.query(pdb, "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER); INSERT INTO t(v) VALUES (1), (2), (3)")
			w.dbs = append(w.dbs, pdb)
		}
	}
	require.Empty(t, w.failed, "setup queries failed")

	stop := make(chan struct{})
	wait := w.run(4, stop)
	phase := func(what string, d time.Duration) {
		t.Logf("%s: %s", time.Now().Format(time.TimeOnly), what)
		time.Sleep(d) // phase duration under load (real processes)
	}
	phase("healthy", 3*time.Second)

	// The broker goes away: hosts spill, consumers retry.
	c.Broker.Close()
	phase("broker closed", 5*time.Second)
	c.StartBroker(t, c.BrokerAddr)
	phase("broker restarted on its data", 4*time.Second)

	// The sink dies mid-stream (between inserts and commits, whatever it
	// was doing) and comes back: its uncommitted batches are redelivered.
	c.Pipe.Restart(t, 2*time.Second)
	phase("pipeline role killed and restarted", 0)
	// The restarted sink takes over the dead member's partitions once the
	// group's session timeout (10 s) expires; wait until it inserts.
	require.Eventually(t, func() bool {
		var st pipelineStatusJSON
		return harness.GetJSON(c.PipeURL+"/v1/status", &st) == nil && st.ClickHouse != nil && st.ClickHouse.Sink.Inserted > 0
	}, 45*time.Second, 250*time.Millisecond, "the restarted sink never inserted: %s", c.Pipe.Log)
	phase("restarted sink inserting", time.Second)

	// ClickHouse is down for 30 s: the sink retries without committing.
	require.NoError(t, c.CH.Close())
	phase("clickhouse stopped", 30*time.Second)
	var down pipelineStatusJSON
	require.NoError(t, harness.GetJSON(c.PipeURL+"/v1/status", &down))
	require.NotNil(t, down.ClickHouse)
	t.Logf("after 30 s without ClickHouse: reachable=%v, %d insert attempts failed, lag %d records",
		down.ClickHouse.Reachable, down.ClickHouse.Sink.InsertErrors, down.ClickHouse.Sink.Lag)
	assert.False(t, down.ClickHouse.Reachable, "the status must say ClickHouse is down")
	assert.NotZero(t, down.ClickHouse.Sink.InsertErrors, "the sink never tried to insert while ClickHouse was down: the fault was not exercised")
	c.CH = harness.StartClickHouse(t, filepath.Join(c.Dir, "clickhouse"), c.CHTCP, c.CHHTTP)
	phase("clickhouse restarted on its data", 3*time.Second)

	close(stop)
	wait()
	require.Empty(t, w.failed, "queries failed while the plane was faulted (%d sent)", w.sent)

	st, err := chsink.Open(chsink.StoreConfig{Options: c.CH.Options()})
	require.NoError(t, err)
	defer st.Close()
	got := func() map[string]chsink.Totals {
		out := map[string]chsink.Totals{}
		now := time.Now().UTC()
		for acct := range w.truth.acct {
			var sum chsink.Totals
			for _, day := range []time.Time{now.Add(-24 * time.Hour), now} { // a run across midnight
				tt, err := st.TotalsForAccountDay(context.Background(), acct, day)
				if err != nil {
					return nil
				}
				sum.Queries += tt.Queries
				sum.RowsRead += tt.RowsRead
				sum.RowsWritten += tt.RowsWritten
				sum.Errors += tt.Errors
			}
			out[acct] = sum
		}
		return out
	}
	want := map[string]chsink.Totals{}
	var queries int64
	for acct, tt := range w.truth.acct {
		want[acct] = chsink.Totals{Queries: tt.Queries, RowsRead: tt.RowsRead, RowsWritten: tt.RowsWritten}
		queries += tt.Queries
	}
	var last map[string]chsink.Totals
	ok := assert.Eventually(t, func() bool {
		last = got()
		return assert.ObjectsAreEqual(want, last)
	}, 90*time.Second, 500*time.Millisecond)
	if !ok {
		t.Errorf("ClickHouse totals never matched what the edge answered:\nwant %+v\n got %+v", want, last)
	}
	// Still exact a moment later: nothing arrives twice after the fact.
	time.Sleep(3 * time.Second) // a window for a late duplicate to show (an absence: nothing to wait on)
	assert.Equal(t, want, got(), "totals moved after they matched")

	// Storage: the sizes the hosts measured reached the catalog's account
	// totals (storage consumer), and the snapshotter copied those totals
	// into storage_snapshots (a pass every 2 s here).
	cat, err := raftmeta.NewClient([]string{c.CatAddr})
	require.NoError(t, err)
	defer cat.Close()
	hist, err := snapshot.NewHistory(st.Conn(), st.Database())
	require.NoError(t, err)
	for acct := range want {
		var a fsm.Account
		var snap snapshot.AccountStorage
		assert.Eventually(t, func() bool {
			var err error
			if a, err = cat.Account(context.Background(), acct, raftmeta.LinearizableRead()); err != nil || a.StorageBytes == 0 {
				return false
			}
			snap, err = hist.StorageAt(context.Background(), acct, time.Now())
			return err == nil && snap.SizeBytes == a.StorageBytes && snap.Databases == 3
		}, 30*time.Second, 250*time.Millisecond, "account %s: catalog total %d bytes, snapshot %+v", acct, a.StorageBytes, snap)
	}

	// The reconciler, comparing ClickHouse with the host's usage
	// sequences, finds nothing missing once the totals are exact.
	var status pipelineStatusJSON
	settled := time.Now()
	require.Eventually(t, func() bool {
		return harness.GetJSON(c.PipeURL+"/v1/status", &status) == nil && status.ClickHouse != nil &&
			status.ClickHouse.Reconcile.At.After(settled) && status.ClickHouse.Reconcile.Error == ""
	}, 15*time.Second, 250*time.Millisecond, "no reconciliation after the totals settled")
	assert.Zero(t, status.ClickHouse.Reconcile.Missing, "usage events missing in ClickHouse")
	assert.Equal(t, 1, status.ClickHouse.Reconcile.Producers, "one host, one boot")
	require.NotNil(t, status.ClickHouse)
	t.Logf("%d queries over %d accounts exact in ClickHouse; sink after its restart: %d events inserted, %d insert errors (retried), %d duplicates dropped; %d storage snapshot passes",
		queries, len(want), status.ClickHouse.Sink.Inserted, status.ClickHouse.Sink.InsertErrors, status.ClickHouse.Sink.DuplicatesDropped, status.ClickHouse.Snapshots.Passes)
	assert.NotZero(t, status.ClickHouse.Snapshots.Passes)
}

// pipelineStatusJSON is the part of the pipeline role's /v1/status the
// tests read.
type pipelineStatusJSON struct {
	ClickHouse *struct {
		Reachable bool           `json:"reachable"`
		Sink      chsink.Stats   `json:"sink"`
		Snapshots snapshot.Stats `json:"snapshots"`
		Reconcile struct {
			Producers int       `json:"producers"`
			Missing   uint64    `json:"missing_events"`
			At        time.Time `json:"at"`
			Error     string    `json:"error"`
		} `json:"reconcile"`
	} `json:"clickhouse"`
}
