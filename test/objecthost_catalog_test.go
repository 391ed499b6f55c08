package test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost"
	"github.com/shoaldb/shoal/objecthost/sqlexec"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// startCatalog3 starts a 3-voter catalog over real TCP with fsync and
// returns a client of it.
func startCatalog3(t *testing.T) *raftmeta.Client {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var addrs []string
	for i := 0; i < 3; i++ {
		cfg := raftmeta.Config{ID: fmt.Sprintf("oc%d", i), Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			Logger: quiet, RaftLogOutput: io.Discard}
		if i == 0 {
			cfg.Bootstrap = true
		} else {
			cfg.Join = []string{addrs[0]}
		}
		n, err := raftmeta.NewNode(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = n.Close() })
		addrs = append(addrs, n.HTTPAddr())
		if i == 0 {
			require.Eventually(t, n.IsLeader, 20*time.Second, 20*time.Millisecond)
		}
	}
	cl, err := raftmeta.NewClient(addrs)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func randomObjectID(t *testing.T) string {
	b := make([]byte, 16)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

func openHeartbeatingHost(t *testing.T, dir string, cl *raftmeta.Client) *objecthost.Host {
	h, err := objecthost.Open(objecthost.Config{
		ID: "hb-host", Dir: dir, Address: "127.0.0.1:1", Region: "weur", Capacity: 1000,
		Catalog:           objecthost.RaftmetaCatalog{C: cl},
		HeartbeatInterval: 300 * time.Millisecond,
		HeartbeatTick:     50 * time.Millisecond,
		HeartbeatRetry:    100 * time.Millisecond,
		CreationGrace:     time.Second,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	return h
}

func selectOne(h *objecthost.Host, objectID, db, acct string) error {
	_, err := h.Query(context.Background(), objectID, objecthost.Identity{DatabaseUUID: db, AccountID: acct},
		sqlexec.Request{Statements: []sqlexec.Statement{{SQL: "SELECT 1"}}})
	return err
}

func objState(t *testing.T, h *objecthost.Host, objectID string) string {
	info, err := h.Info(context.Background(), objectID)
	require.NoError(t, err)
	return info.State
}

// TestObjectHostHeartbeatsAgainstRealCatalog checks the self-repair flows of
// the design brief against a real 3-node Raft catalog: the orphan of a create
// whose catalog write never happened dies at its first heartbeat after the
// grace period; a database deleted in the catalog refuses queries once its
// heartbeat tells it; a catalog-known database stays active; and states
// survive a restart of the host.
func TestObjectHostHeartbeatsAgainstRealCatalog(t *testing.T) {
	ctx := context.Background()
	cl := startCatalog3(t)
	acct, err := cl.CreateAccount(ctx, fsm.CreateAccount{ID: "acct-hb", Name: "hb", Tier: "paid",
		Limits: fsm.Limits{MaxDatabases: 100, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 1 << 30}})
	require.NoError(t, err)

	dir := t.TempDir()
	h := openHeartbeatingHost(t, dir, cl)

	// The orphan: init on the object, then the create "crashed" before the
	// catalog write (the creation checkpoint) — no catalog row.
	orphanObj, orphanDB := randomObjectID(t), uuid.NewString()
	_, err = h.Init(ctx, orphanObj, objecthost.InitRequest{DatabaseUUID: orphanDB, AccountID: acct.ID, Name: "orphan"})
	require.NoError(t, err)
	// A completed create: init, then the catalog write.
	liveObj, liveDB := randomObjectID(t), uuid.NewString()
	_, err = h.Init(ctx, liveObj, objecthost.InitRequest{DatabaseUUID: liveDB, AccountID: acct.ID, Name: "live"})
	require.NoError(t, err)
	_, err = cl.CreateDatabase(ctx, fsm.CreateDatabase{UUID: liveDB, AccountID: acct.ID, Name: "live", ObjectID: liveObj,
		HostID: "hb-host", Region: "weur"})
	require.NoError(t, err)
	// A third one that will be deleted through the catalog.
	doomedObj, doomedDB := randomObjectID(t), uuid.NewString()
	_, err = h.Init(ctx, doomedObj, objecthost.InitRequest{DatabaseUUID: doomedDB, AccountID: acct.ID, Name: "doomed"})
	require.NoError(t, err)
	_, err = cl.CreateDatabase(ctx, fsm.CreateDatabase{UUID: doomedDB, AccountID: acct.ID, Name: "doomed", ObjectID: doomedObj,
		HostID: "hb-host", Region: "weur"})
	require.NoError(t, err)

	// Queries are accepted once initialised, before any confirm.
	require.NoError(t, selectOne(h, orphanObj, orphanDB, acct.ID))
	require.NoError(t, selectOne(h, liveObj, liveDB, acct.ID))

	// The orphan dies within one heartbeat after its grace period (1 s + 300 ms).
	require.Eventually(t, func() bool { return objState(t, h, orphanObj) == fsm.StateDeleted },
		10*time.Second, 50*time.Millisecond, "orphan never marked itself deleted")
	err = selectOne(h, orphanObj, orphanDB, acct.ID)
	require.Error(t, err)
	assert.True(t, errors.Is(err, objecthost.ErrDeleted), "orphan query error: %v", err)

	// Delete through the catalog (the checkpoint), without telling the host:
	// its heartbeat is the backstop.
	_, err = cl.DeleteDatabase(ctx, acct.ID, doomedDB)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return objState(t, h, doomedObj) == fsm.StateDeleted },
		10*time.Second, 50*time.Millisecond, "catalog-deleted database still active on its host")
	require.ErrorIs(t, selectOne(h, doomedObj, doomedDB, acct.ID), objecthost.ErrDeleted)

	// The live database outlived several heartbeats and its grace period.
	assert.Equal(t, fsm.StateActive, objState(t, h, liveObj))
	require.NoError(t, selectOne(h, liveObj, liveDB, acct.ID))

	// States survive a restart.
	require.NoError(t, h.Close())
	h2 := openHeartbeatingHost(t, dir, cl)
	defer h2.Close()
	assert.Equal(t, fsm.StateDeleted, objState(t, h2, orphanObj))
	assert.Equal(t, fsm.StateDeleted, objState(t, h2, doomedObj))
	assert.Equal(t, fsm.StateActive, objState(t, h2, liveObj))
	require.NoError(t, selectOne(h2, liveObj, liveDB, acct.ID))
	require.ErrorIs(t, selectOne(h2, orphanObj, orphanDB, acct.ID), objecthost.ErrDeleted)

	// The host registered itself in the catalog.
	hosts, err := cl.Hosts(ctx, raftmeta.ReadOptions{Consistency: raftmeta.Linearizable, NoCache: true})
	require.NoError(t, err)
	var found bool
	for _, hh := range hosts {
		found = found || hh.ID == "hb-host"
	}
	assert.True(t, found, "host not registered: %s", mustJSON(hosts))
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// heartbeatOutcome reads shoal_objecthost_heartbeats_total{outcome}.
func heartbeatOutcome(t *testing.T, h *objecthost.Host, outcome string) float64 {
	mfs, err := h.Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "shoal_objecthost_heartbeats_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestObjectHostDigestHeartbeatsAgainstRealCatalog: against a real 3-node
// Raft catalog, a host whose databases are all settled heartbeats them by
// bucket digests (no per-database lookups while nothing changes), and
// still learns, through the per-database heartbeat of the bucket that
// differs, a delete it was not told about, and retires an object whose
// database was relocated to another host.
func TestObjectHostDigestHeartbeatsAgainstRealCatalog(t *testing.T) {
	ctx := context.Background()
	cl := startCatalog3(t)
	acct, err := cl.CreateAccount(ctx, fsm.CreateAccount{ID: "acct-dg", Name: "dg", Tier: "paid",
		Limits: fsm.Limits{MaxDatabases: 1000, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 1 << 30}})
	require.NoError(t, err)
	_, err = cl.RegisterHost(ctx, fsm.RegisterHost{ID: "other-host", Address: "127.0.0.1:2", Region: "weur", State: fsm.HostStateActive})
	require.NoError(t, err)
	h := openHeartbeatingHost(t, t.TempDir(), cl)
	defer h.Close()

	type dbRef struct{ obj, uuid string }
	var dbs []dbRef
	for i := 0; i < 40; i++ {
		d := dbRef{randomObjectID(t), uuid.NewString()}
		_, err := h.Init(ctx, d.obj, objecthost.InitRequest{DatabaseUUID: d.uuid, AccountID: acct.ID, Name: fmt.Sprintf("d%d", i), RoutingGeneration: 1})
		require.NoError(t, err)
		_, err = cl.CreateDatabase(ctx, fsm.CreateDatabase{UUID: d.uuid, AccountID: acct.ID, Name: fmt.Sprintf("d%d", i), ObjectID: d.obj,
			HostID: "hb-host", Region: "weur"})
		require.NoError(t, err)
		_, err = h.Confirm(ctx, d.obj, 1)
		require.NoError(t, err)
		dbs = append(dbs, d)
	}
	// Every database answered by digests for a while (several intervals).
	require.Eventually(t, func() bool { return heartbeatOutcome(t, h, "digest_ok") >= 3*40 },
		10*time.Second, 50*time.Millisecond, "no digest heartbeats")
	// Two more rounds of digests for every database (counted, not timed:
	// on a loaded machine a second of sleep may hold none), and no
	// per-database heartbeat among them.
	perDB, digests := heartbeatOutcome(t, h, "ok"), heartbeatOutcome(t, h, "digest_ok")
	require.Eventually(t, func() bool { return heartbeatOutcome(t, h, "digest_ok") >= digests+2*40 },
		time.Minute, 50*time.Millisecond, "digest heartbeats stopped")
	assert.Equal(t, perDB, heartbeatOutcome(t, h, "ok"), "no per-database heartbeat while nothing changes")

	// Deleted in the catalog only: learned through its heartbeat.
	doomed := dbs[3]
	_, err = cl.DeleteDatabase(ctx, acct.ID, doomed.uuid)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return objState(t, h, doomed.obj) == fsm.StateDeleted },
		10*time.Second, 50*time.Millisecond, "catalog-deleted database still active on its host")

	// Relocated to another host: this host's object is retired.
	moved := dbs[7]
	_, err = cl.RelocateDatabase(ctx, fsm.RelocateDatabase{UUID: moved.uuid, FromObjectID: moved.obj,
		ObjectID: randomObjectID(t), HostID: "other-host"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return objState(t, h, moved.obj) == fsm.StateDeleted },
		10*time.Second, 50*time.Millisecond, "superseded object not retired")

	// The rest are still active and served.
	for _, d := range dbs {
		if d == doomed || d == moved {
			continue
		}
		require.Equal(t, fsm.StateActive, objState(t, h, d.obj))
	}
	require.NoError(t, selectOne(h, dbs[0].obj, dbs[0].uuid, acct.ID))
}
