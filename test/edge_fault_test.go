package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/internal/frame"
	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/pipeline/event"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/test/harness"
)

// TestEdgeCreateFaultsConverge injects the create flow's failpoints with real
// components (Raft catalog, object host with heartbeats, edge) and checks the
// system's invariants: a failed attempt's orphan object dies by heartbeat, the
// retry uses new ids, and a create whose answer is lost after the catalog
// write (the checkpoint) exists and is queryable.
func TestEdgeCreateFaultsConverge(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := raftmeta.NewNode(raftmeta.Config{ID: "c0", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, Logger: quiet, RaftLogOutput: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { _ = node.Close() })
	require.Eventually(t, node.IsLeader, 20*time.Second, 20*time.Millisecond)
	hostCl, err := raftmeta.NewClient([]string{node.HTTPAddr()})
	require.NoError(t, err)
	ln, hostAddr := harness.Listen(t)
	h, err := objecthost.Open(objecthost.Config{ID: "h0", Dir: t.TempDir(), Address: hostAddr, Region: "weur", Capacity: 100,
		Catalog: objecthost.RaftmetaCatalog{C: hostCl}, Logger: quiet,
		HeartbeatInterval: 300 * time.Millisecond, HeartbeatTick: 50 * time.Millisecond, CreationGrace: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	// Record every object id the edge initialises. The host refuses the
	// frame transport's upgrade (as a host of a version without it does),
	// so the edge's inits come as HTTP requests this wrapper sees (on a
	// frame connection they would reach the host's handler directly).
	var mu sync.Mutex
	var inits []string
	inner := h.Handler()
	harness.Serve(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == frame.UpgradePath:
			http.Error(w, "no such route", http.StatusNotFound)
			return
		case r.URL.Path == "/v1/batch/init": // the edge's coalesced inits
			body, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			var req event.InitBatchRequest
			require.NoError(t, json.Unmarshal(body, &req))
			mu.Lock()
			for _, it := range req.Inits {
				inits = append(inits, it.ObjectID)
			}
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		case strings.HasSuffix(r.URL.Path, "/init"):
			mu.Lock()
			inits = append(inits, strings.Split(r.URL.Path, "/")[3])
			mu.Unlock()
		}
		inner.ServeHTTP(w, r)
	}))

	var afterInitFails, afterWriteFails atomic.Int64
	afterInitFails.Store(1)
	edgeCl, err := raftmeta.NewClient([]string{node.HTTPAddr()})
	require.NoError(t, err)
	srv, err := edge.New(edge.Options{Catalog: edge.RaftmetaCatalog{C: edgeCl}, Dir: t.TempDir(), Region: "weur",
		AdminToken: "admin", Logger: quiet, CreateBackoff: time.Millisecond,
		Failpoint: func(step string) error {
			switch {
			case step == "create:after-init" && afterInitFails.Add(-1) >= 0:
				return fmt.Errorf("%w: injected after init", edge.ErrUnavailable)
			case step == "create:after-catalog-write" && afterWriteFails.Add(-1) >= 0:
				return errors.New("injected: edge died after the checkpoint")
			}
			return nil
		}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	eln, eaddr := harness.Listen(t)
	harness.Serve(t, eln, srv)
	c := &harness.E2ECluster{Admin: "admin", EdgeURL: []string{"http://" + eaddr}}
	require.Eventually(t, func() bool {
		hs, err := edgeCl.Hosts(t.Context(), raftmeta.ReadOptions{Consistency: raftmeta.Stale, NoCache: true})
		return err == nil && len(hs) == 1
	}, 20*time.Second, 50*time.Millisecond)
	acct, bearer := c.SetupAccount(t, "free")
	base := c.EdgeURL[0] + "/client/v4/accounts/" + acct + "/d1/database"

	// 1. Init succeeds, then the attempt fails before the checkpoint: the edge
	// retries with new ids and answers success.
	a := harness.Call(t, "POST", base, bearer, map[string]any{"name": "first"})
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var first struct{ UUID string }
	require.NoError(t, json.Unmarshal(a.Result, &first))
	mu.Lock()
	require.Len(t, inits, 2)
	orphan, live := inits[0], inits[1]
	mu.Unlock()
	require.NotEqual(t, orphan, live)
	row, err := edgeCl.Database(t.Context(), first.UUID, raftmeta.LeaderRead())
	require.NoError(t, err)
	assert.Equal(t, live, row.ObjectID, "the catalog names the retry's object")
	objectState := func(id string) (string, bool) {
		a := harness.Call(t, "GET", "http://"+hostAddr+"/v1/objects/"+id, "", nil)
		var info struct {
			State     string `json:"state"`
			Confirmed bool   `json:"confirmed"`
		}
		_ = json.Unmarshal(a.Result, &info)
		return info.State, info.Confirmed
	}
	// The orphan converges: its heartbeat finds no catalog row after the
	// creation grace and it marks itself deleted. The live one is confirmed.
	require.Eventually(t, func() bool { st, _ := objectState(orphan); return st == "deleted" },
		30*time.Second, 100*time.Millisecond, "the orphan of the failed attempt never died")
	require.Eventually(t, func() bool { st, ok := objectState(live); return st == "active" && ok },
		30*time.Second, 100*time.Millisecond)
	a = harness.Call(t, "POST", base+"/"+first.UUID+"/query", bearer, map[string]any{"sql": "SELECT 1"})
	assert.Equal(t, 200, a.Status, "%s", a.Raw)

	// 2. The edge "dies" right after the checkpoint: the client sees an error,
	// the database exists, is queryable, and heartbeats confirm its object.
	afterWriteFails.Store(1)
	a = harness.Call(t, "POST", base, bearer, map[string]any{"name": "second"})
	require.GreaterOrEqual(t, a.Status, 500, "%s", a.Raw)
	var second string
	require.Eventually(t, func() bool {
		a = harness.Call(t, "GET", base+"?name=second", bearer, nil)
		var items []struct{ UUID string }
		_ = json.Unmarshal(a.Result, &items)
		if len(items) == 1 {
			second = items[0].UUID
		}
		return second != ""
	}, 10*time.Second, 50*time.Millisecond)
	a = harness.Call(t, "POST", base+"/"+second+"/query", bearer, map[string]any{"sql": "SELECT 2"})
	assert.Equal(t, 200, a.Status, "%s", a.Raw)
	row, err = edgeCl.Database(t.Context(), second, raftmeta.LeaderRead())
	require.NoError(t, err)
	require.Eventually(t, func() bool { st, ok := objectState(row.ObjectID); return st == "active" && ok },
		30*time.Second, 100*time.Millisecond, "heartbeats never confirmed the object the edge could not")
	// A client retry of the lost create is refused: the name exists.
	a = harness.Call(t, "POST", base, bearer, map[string]any{"name": "second"})
	assert.Equal(t, 400, a.Status, "%s", a.Raw)
	assert.Equal(t, 7502, a.Code())
}
