package objecthost

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// syncBuffer is a log sink safe for the host's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func loggedHost(t *testing.T, mod func(*Config)) (*testHost, *syncBuffer) {
	buf := &syncBuffer{}
	th := hbHost(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(buf, nil))
		if mod != nil {
			mod(c)
		}
	})
	return th, buf
}

// The data-loss defect of issue 9: a replica replaying its log answers
// "unknown" for databases the cluster committed long ago. A stale unknown
// must never delete; the linearizable confirmation decides.
func TestHeartbeatStaleUnknownIsConfirmedNotKilled(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	d := newDB("a")
	th.mustInit(t, d)
	th.cat.set(d.uuid, "a", fsm.StateActive, 0)
	th.cat.staleUnknown = map[string]bool{d.uuid: true}

	var killed, confirms int
	for i := 0; i < 5; i++ { // 55 s: well past the 30 s grace
		rep := th.beat()
		killed += rep.OrphansKilled
		confirms += rep.Confirmations
	}
	assert.Zero(t, killed)
	assert.Positive(t, confirms, "the stale unknown was re-asked linearizably")
	assert.Contains(t, th.cat.confirms, d.uuid)
	_, err := th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	assert.NoError(t, err, "the database still answers")
	info, err := th.Info(ctx, d.obj)
	require.NoError(t, err)
	assert.True(t, info.Confirmed, "the linearizable answer (active) was applied: confirmed")
}

func TestHeartbeatFailedConfirmationDeletesNothing(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	orphan := newDB("a")
	th.mustInit(t, orphan)
	th.cat.confirmFail = true
	for i := 0; i < 5; i++ {
		rep := th.beat()
		require.Zero(t, rep.OrphansKilled)
	}
	_, err := th.Query(ctx, orphan.obj, orphan.id(), q("SELECT 1"))
	require.NoError(t, err, "no confirmation, no kill")

	// Once the catalog confirms, the real orphan dies.
	th.cat.confirmFail = false
	killed := 0
	for i := 0; i < 2; i++ {
		killed += th.beat().OrphansKilled
	}
	assert.Equal(t, 1, killed)
	_, err = th.Query(ctx, orphan.obj, orphan.id(), q("SELECT 1"))
	assert.ErrorIs(t, err, ErrDeleted)
}

// A database once confirmed active is not the leftover of a failed create:
// if even a linearizable read does not know it, the catalog lost it (say, a
// restore from an old backup). The host keeps it and raises an alarm.
func TestHeartbeatLostConfirmedDatabaseIsKeptWithAlarm(t *testing.T) {
	th, logs := loggedHost(t, nil)
	ctx := context.Background()
	d := newDB("acct-lost")
	th.mustInit(t, d)
	_, err := th.Confirm(ctx, d.obj, 1)
	require.NoError(t, err)
	// The catalog never had (or lost) the row.
	held := 0
	for i := 0; i < 5; i++ {
		rep := th.beat()
		require.Zero(t, rep.OrphansKilled)
		held += rep.LostHeld
	}
	assert.Positive(t, held)
	_, err = th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	require.NoError(t, err, "kept and serving")

	alarms := th.Alarms()
	require.Len(t, alarms, 1)
	assert.Equal(t, "lost_databases", alarms[0].Kind)
	assert.Equal(t, []string{d.uuid}, alarms[0].Sample)
	assert.Contains(t, logs.String(), d.uuid)
	assert.Contains(t, logs.String(), "acct-lost")

	// The alarm is visible over HTTP and in the metrics.
	srv := httptest.NewServer(th.Handler())
	defer srv.Close()
	code, env := call(t, srv.Client(), srv, http.MethodGet, "/v1/status", nil, nil)
	require.Equal(t, http.StatusOK, code)
	var st HostStatus
	require.NoError(t, json.Unmarshal(env.Result, &st))
	require.Len(t, st.Alarms, 1)
	assert.Equal(t, "lost_databases", st.Alarms[0].Kind)
	assert.Equal(t, 1, st.Active)
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	assert.Contains(t, body.String(), "shoal_objecthost_alarms 1")
	assert.Contains(t, body.String(), `shoal_objecthost_heartbeats_total{outcome="lost_held"}`)
}

// A mass of orphan verdicts at once is a bug to stop and report.
func TestHeartbeatMassOfOrphansDeletesNone(t *testing.T) {
	th, logs := loggedHost(t, func(c *Config) { c.OrphanMassFloor = 3 })
	ctx := context.Background()
	var dbs []db
	for i := 0; i < 8; i++ {
		d := newDB("a")
		th.mustInit(t, d)
		dbs = append(dbs, d)
	}
	held := 0
	for i := 0; i < 5; i++ {
		rep := th.beat()
		require.Zero(t, rep.OrphansKilled, "pass %d", i)
		held += rep.OrphansHeld
	}
	assert.Positive(t, held)
	for _, d := range dbs {
		_, err := th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
		require.NoError(t, err)
	}
	alarms := th.Alarms()
	require.Len(t, alarms, 1)
	assert.Equal(t, "mass_orphans", alarms[0].Kind)
	assert.Equal(t, 8, alarms[0].Databases)
	assert.Contains(t, logs.String(), "mass of orphan verdicts")
}

// Every host-side delete is logged with database, account and reason.
func TestHostDeletesAreLogged(t *testing.T) {
	th, logs := loggedHost(t, nil)
	ctx := context.Background()
	orphan, gone, api := newDB("acct-o"), newDB("acct-g"), newDB("acct-api")
	for _, d := range []db{orphan, gone, api} {
		th.mustInit(t, d)
	}
	th.cat.set(gone.uuid, "acct-g", fsm.StateDeleted, 2)
	th.cat.set(api.uuid, "acct-api", fsm.StateActive, 0)
	_, err := th.Delete(ctx, api.obj, 3)
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		th.beat()
	}
	type line struct {
		Msg, Database, Account, Reason string
	}
	got := map[string]line{}
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var ln line
		require.NoError(t, json.Unmarshal([]byte(l), &ln))
		if ln.Msg == "database marked deleted" {
			got[ln.Database] = ln
		}
	}
	require.Len(t, got, 3, "one log line per deleted database: %s", logs.String())
	assert.Equal(t, "acct-o", got[orphan.uuid].Account)
	assert.Contains(t, got[orphan.uuid].Reason, "orphan")
	assert.Contains(t, got[gone.uuid].Reason, "deleted in the catalog")
	assert.Contains(t, got[api.uuid].Reason, "API")
}

// The race the robustness suite found (issue 12): an edge's create for an
// object was still in flight when the host's linearizable read answered
// unknown past the grace, and committed just after. Without the fence the
// host deleted the object of a database the API then acknowledged (listed,
// every query 404). The fence finds the row and the object is kept.
func TestHeartbeatOrphanVerdictRefutedByTheFence(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	d := newDB("a")
	th.mustInit(t, d)
	th.cat.set(d.uuid, "a", fsm.StateActive, 0)
	th.cat.staleUnknown = map[string]bool{d.uuid: true}
	th.cat.confirmMisses = map[string]bool{d.uuid: true}

	var killed, saved int
	for i := 0; i < 5; i++ { // well past the grace
		rep := th.beat()
		killed += rep.OrphansKilled
		saved += rep.OrphansSaved
	}
	assert.Zero(t, killed)
	assert.Positive(t, saved, "the fence refuted the orphan verdict")
	assert.Empty(t, th.cat.fenced)
	_, err := th.Query(ctx, d.obj, d.id(), q("SELECT 1"))
	assert.NoError(t, err, "the database still answers")
}

// A failed fence deletes nothing; the next pass fences and deletes.
func TestHeartbeatOrphanKilledOnlyOnceFenced(t *testing.T) {
	th := hbHost(t, nil)
	ctx := context.Background()
	orphan := newDB("a")
	th.mustInit(t, orphan)
	th.cat.fenceFail = true
	for i := 0; i < 5; i++ {
		assert.Zero(t, th.beat().OrphansKilled, "no fence, no delete")
	}
	_, err := th.Query(ctx, orphan.obj, orphan.id(), q("SELECT 1"))
	require.NoError(t, err)
	th.cat.fenceFail = false
	killed := 0
	for i := 0; i < 3 && killed == 0; i++ {
		killed += th.beat().OrphansKilled
	}
	assert.Equal(t, 1, killed)
	assert.Equal(t, []string{orphan.uuid}, th.cat.fenced)
}
