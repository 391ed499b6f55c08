package objecthost

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/history"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// s3Archive is an archive in gofakes3, a real S3-protocol server over HTTP
// on loopback.
func s3Archive(t *testing.T) *history.S3Store {
	backend := s3mem.New()
	srv := httptest.NewUnstartedServer(gofakes3.New(backend).Server())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // gofakes3 writes some headers twice
	srv.Start()
	t.Cleanup(srv.Close)
	require.NoError(t, backend.CreateBucket("archive"))
	st, err := history.NewS3Store(history.S3Config{
		Endpoint: strings.TrimPrefix(srv.URL, "http://"), Bucket: "archive", Prefix: "shoal/",
		Region: "us-east-1", AccessKey: "test", SecretKey: "testtesttest", PathStyle: true,
	})
	require.NoError(t, err)
	return st
}

// TestDeletedArchivesSwept: the archive of a deleted database is deleted
// from the store once the account tier's retention passed since the
// catalog's deletion time (7 days free, 30 paid), on the catalog's
// linearizable answer, even after the host swept the object itself; the
// archive of a database relocated elsewhere (its superseded object here is
// marked deleted, same UUID) and of one the catalog does not know are
// never deleted; a failing catalog deletes nothing; a mass of due archives
// is held with an alarm until the limit is raised. gofakes3 as the store,
// the host's fake clock.
func TestDeletedArchivesSwept(t *testing.T) {
	ctx := context.Background()
	store := s3Archive(t)
	th := hbHost(t, func(c *Config) {
		c.History = sweepHistory(store)
	})
	th.cat.setAccount(fsm.Account{ID: "paid", Tier: fsm.TierPaid})
	th.cat.setAccount(fsm.Account{ID: "free", Tier: fsm.TierFree})
	paid, free, moved, unknown, live := newDB("paid"), newDB("free"), newDB("paid"), newDB("paid"), newDB("paid")
	all := []db{paid, free, moved, unknown, live}
	for _, d := range all {
		th.mustInit(t, d)
		th.cat.setObject(d.uuid, d.account, d.obj, 1)
		th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()))")
		th.exec(t, d, "INSERT INTO t(v) VALUES ('x')")
		th.archivedUpTo(t, d)
	}
	objects := func(d db) int { return archivedObjects(t, store, d) }
	for _, d := range all {
		require.NotZero(t, objects(d), "archived")
	}

	// paid and free are deleted; moved was relocated to another host (the
	// catalog names a newer object; the heartbeat retires this one);
	// unknown's catalog row is gone (as from a catalog restored from an
	// older backup) after the host deleted it.
	deletedAt := th.clock.Now()
	for _, d := range []db{paid, free, unknown} {
		_, err := th.Delete(ctx, d.obj, 2)
		require.NoError(t, err)
	}
	for _, d := range []db{paid, free} {
		th.cat.mu.Lock()
		th.cat.dbs[d.uuid] = deletedState(d, deletedAt.UnixNano())
		th.cat.mu.Unlock()
	}
	th.cat.setObject(moved.uuid, moved.account, newObjectID(), 2)
	require.Equal(t, 1, th.beat().Superseded)
	th.cat.mu.Lock()
	delete(th.cat.dbs, unknown.uuid)
	th.cat.mu.Unlock()
	keptMoved, keptLive := objects(moved), objects(live)

	pass := func() DeletedArchiveReport {
		t.Helper()
		rep, err := th.hist.sweepDeletedArchives(ctx, th.Host)
		require.NoError(t, err)
		return rep
	}
	// A day later the host sweeps the deleted objects (DeletedRetention);
	// their staging areas stay and remember the archives.
	th.clock.Advance(25 * time.Hour)
	n, err := th.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	th.cat.mu.Lock()
	th.cat.confirms = nil
	th.cat.mu.Unlock()
	rep := pass()
	assert.Equal(t, DeletedArchiveReport{Areas: 4, Asked: 4, Unknown: 1, Live: 1, NotDue: 2}, rep)
	assert.ElementsMatch(t, []string{paid.uuid, free.uuid, moved.uuid, unknown.uuid}, th.cat.confirms, "asked linearizably")
	// moved lives elsewhere: its area here is removed, its archive kept.
	assert.Equal(t, keptMoved, objects(moved))
	rep = pass()
	assert.Equal(t, 3, rep.Areas)

	// The catalog cannot answer: nothing is deleted.
	th.clock.Advance(7 * 24 * time.Hour)
	th.cat.mu.Lock()
	th.cat.confirmFail = true
	th.cat.mu.Unlock()
	_, err = th.hist.sweepDeletedArchives(ctx, th.Host)
	require.Error(t, err)
	assert.NotZero(t, objects(free))
	th.cat.mu.Lock()
	th.cat.confirmFail = false
	th.cat.mu.Unlock()

	// 8 days after the deletion: the free tier's archive goes, the paid
	// one stays.
	rep = pass()
	assert.Equal(t, 1, rep.Deleted)
	assert.Equal(t, 1, rep.NotDue)
	assert.Zero(t, objects(free))
	assert.NotZero(t, objects(paid))

	// 31 days: the paid one too; the others never.
	th.clock.Advance(23 * 24 * time.Hour)
	rep = pass()
	assert.Equal(t, 1, rep.Deleted)
	assert.Zero(t, objects(paid))
	assert.Equal(t, keptMoved, objects(moved), "a relocated database's archive is never deleted")
	assert.NotZero(t, objects(unknown), "unknown to the catalog: kept")
	assert.Equal(t, keptLive, objects(live))
	rep = pass()
	assert.Equal(t, DeletedArchiveReport{Areas: 1, Asked: 1, Unknown: 1}, rep, "only unknown's area is left")
	_, err = th.Query(ctx, live.obj, live.id(), q("SELECT count(*) FROM t"))
	require.NoError(t, err)
}

// TestDeletedArchivesMassBrake: more archives due in one pass than the
// limit deletes none and raises "mass_archive_deletes"; once the limit is
// raised the next pass deletes them and the alarm clears.
func TestDeletedArchivesMassBrake(t *testing.T) {
	ctx := context.Background()
	store := s3Archive(t)
	th := hbHost(t, func(c *Config) {
		c.History = &HistoryConfig{Store: store, Shipper: history.ShipperOptions{MaxLag: 50 * time.Millisecond}, SweepInterval: -1,
			DeletedArchiveMassFloor: 2}
	})
	th.cat.setAccount(fsm.Account{ID: "free", Tier: fsm.TierFree})
	var dbs []db
	for range 3 {
		d := newDB("free")
		dbs = append(dbs, d)
		th.mustInit(t, d)
		th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER)")
		th.archivedUpTo(t, d)
		_, err := th.Delete(ctx, d.obj, 2)
		require.NoError(t, err)
		th.cat.mu.Lock()
		th.cat.dbs[d.uuid] = fsm.HeartbeatState{UUID: d.uuid, Known: true, State: fsm.StateDeleted, AccountID: "free", RoutingGeneration: 2, DeletedAt: th.clock.Now().UnixNano()}
		th.cat.mu.Unlock()
	}
	th.clock.Advance(8 * 24 * time.Hour)
	rep, err := th.hist.sweepDeletedArchives(ctx, th.Host)
	require.NoError(t, err)
	assert.Equal(t, 3, rep.Held)
	assert.Zero(t, rep.Deleted)
	kinds := func() map[string]int {
		out := map[string]int{}
		for _, a := range th.Alarms() {
			out[a.Kind] = a.Databases
		}
		return out
	}
	assert.Equal(t, 3, kinds()["mass_archive_deletes"])
	for _, d := range dbs {
		keys, err := store.List(ctx, d.uuid+"/")
		require.NoError(t, err)
		assert.NotEmpty(t, keys, "held")
	}

	th.hist.cfg.DeletedArchiveMassFloor = 3 // the operator lets it through
	rep, err = th.hist.sweepDeletedArchives(ctx, th.Host)
	require.NoError(t, err)
	assert.Equal(t, 3, rep.Deleted)
	assert.NotContains(t, kinds(), "mass_archive_deletes")
	for _, d := range dbs {
		keys, err := store.List(ctx, d.uuid+"/")
		require.NoError(t, err)
		assert.Empty(t, keys)
	}
}

// TestStagingFormerLayoutMigrated: a host started on the former
// per-database staging layout (<staging>/<uuid>/<gen>/) moves each area
// into its object's (<staging>/<uuid>/<object>/) and the database's
// history continues in the same generation; what was unshipped ships.
func TestStagingFormerLayoutMigrated(t *testing.T) {
	ctx := context.Background()
	store := s3Archive(t)
	th := hbHost(t, func(c *Config) {
		c.History = sweepHistory(store)
	})
	d := newDB("a")
	th.mustInit(t, d)
	th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER)")
	th.exec(t, d, "INSERT INTO t(v) VALUES ('one')")
	require.NoError(t, th.Host.Close())
	staging := filepath.Join(th.dir, "history")
	gens, err := os.ReadDir(filepath.Join(staging, d.uuid, d.obj))
	require.NoError(t, err)
	require.Len(t, gens, 1)
	require.NoError(t, os.Rename(filepath.Join(staging, d.uuid, d.obj, gens[0].Name()), filepath.Join(staging, d.uuid, gens[0].Name())))
	require.NoError(t, os.Remove(filepath.Join(staging, d.uuid, d.obj)))

	th.open(t)
	areas, err := history.StagingAreas(staging)
	require.NoError(t, err)
	assert.Equal(t, []history.StagingArea{{Key: d.uuid, Name: d.obj}}, areas)
	th.exec(t, d, "INSERT INTO t(v) VALUES ('two')")
	th.archivedUpTo(t, d)
	vs, err := history.NewArchive(store).Verify(ctx, d.uuid)
	require.NoError(t, err)
	assert.Equal(t, 1, vs.Generations, "the migrated generation continued")
	assert.Contains(t, th.rowsOf(t, d), "two")
}

// TestBucketSweepDeletedArchives: archives of databases deleted while their
// only object was on a host later lost with its disk (no staging area
// anywhere remembers them) are deleted by the bucket-wide pass, on the
// coordinating host only (the active host with the smallest ID), on the
// catalog's linearizable answer and the tier's retention; unknown and live
// databases' archives are kept; a mass of due archives is held with an
// alarm; a failing catalog deletes nothing. gofakes3 as the store.
func TestBucketSweepDeletedArchives(t *testing.T) {
	ctx := context.Background()
	store := s3Archive(t)
	hist := func(c *Config) {
		c.History = sweepHistory(store)
	}
	// Host "host-0" archives four databases, then is lost with its disk.
	lost := hbHost(t, func(c *Config) { c.ID = "host-0"; hist(c) })
	paid, free1, free2, unknown := newDB("paid"), newDB("free"), newDB("free"), newDB("paid")
	for _, d := range []db{paid, free1, free2, unknown} {
		lost.mustInit(t, d)
		lost.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
		lost.exec(t, d, "INSERT INTO t(v) VALUES ('x')")
		lost.archivedUpTo(t, d)
	}
	require.NoError(t, lost.Host.Close())
	require.NoError(t, os.RemoveAll(lost.dir))

	th := hbHost(t, func(c *Config) { hist(c); c.History.DeletedArchiveMassFloor = 1 })
	live := newDB("paid")
	th.mustInit(t, live)
	th.cat.setObject(live.uuid, live.account, live.obj, 1)
	th.exec(t, live, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	th.archivedUpTo(t, live)
	th.cat.setAccount(fsm.Account{ID: "paid", Tier: fsm.TierPaid})
	th.cat.setAccount(fsm.Account{ID: "free", Tier: fsm.TierFree})
	deletedAt := th.clock.Now().UnixNano()
	th.cat.mu.Lock()
	for _, d := range []db{paid, free1, free2} {
		th.cat.dbs[d.uuid] = deletedState(d, deletedAt)
	}
	// host-0 is still listed active (nobody declared it lost yet): it is
	// the coordinator, and this host does nothing.
	th.cat.hostList = []fsm.Host{{ID: "host-1", State: fsm.HostStateActive}, {ID: "host-0", State: fsm.HostStateActive}}
	th.cat.mu.Unlock()
	objects := func(d db) int { return archivedObjects(t, store, d) }
	all := []db{paid, free1, free2, unknown, live}
	counts := map[string]int{}
	for _, d := range all {
		counts[d.uuid] = objects(d)
		require.NotZero(t, counts[d.uuid])
	}
	pass := func() BucketArchiveReport {
		t.Helper()
		rep, err := th.hist.sweepBucketArchives(ctx, th.Host)
		require.NoError(t, err)
		return rep
	}
	th.clock.Advance(40 * 24 * time.Hour)
	assert.Equal(t, BucketArchiveReport{}, pass(), "not the coordinator")
	for _, d := range all {
		assert.Equal(t, counts[d.uuid], objects(d))
	}

	// host-0 declared lost: this host coordinates. 40 days after the
	// deletions, three archives are due: above the limit (1), held.
	th.cat.mu.Lock()
	th.cat.hostList[1].State = fsm.HostStateLost
	th.cat.confirms = nil
	th.cat.mu.Unlock()
	rep := pass()
	assert.Equal(t, BucketArchiveReport{Coordinator: true, Listed: 5, Unknown: 1, Live: 1, Due: 3, Held: 3}, rep)
	assert.ElementsMatch(t, []string{paid.uuid, free1.uuid, free2.uuid, unknown.uuid, live.uuid}, th.cat.confirms, "asked linearizably")
	kinds := map[string]int{}
	for _, a := range th.Alarms() {
		kinds[a.Kind] = a.Databases
	}
	assert.Equal(t, 3, kinds["mass_bucket_archive_deletes"])
	for _, d := range all {
		assert.Equal(t, counts[d.uuid], objects(d), "held")
	}

	// The catalog cannot answer: nothing is deleted.
	th.hist.cfg.DeletedArchiveMassFloor = 3
	th.cat.mu.Lock()
	th.cat.confirmFail = true
	th.cat.mu.Unlock()
	_, err := th.hist.sweepBucketArchives(ctx, th.Host)
	require.Error(t, err)
	assert.Equal(t, counts[paid.uuid], objects(paid))
	th.cat.mu.Lock()
	th.cat.confirmFail = false
	th.cat.mu.Unlock()

	// The operator raised the limit: the three go, the others stay.
	rep = pass()
	assert.Equal(t, 3, rep.Deleted)
	for _, d := range []db{paid, free1, free2} {
		assert.Zero(t, objects(d))
	}
	assert.Equal(t, counts[unknown.uuid], objects(unknown), "unknown to the catalog: kept")
	assert.Equal(t, counts[live.uuid], objects(live), "live: kept")
	for _, a := range th.Alarms() {
		assert.NotEqual(t, "mass_bucket_archive_deletes", a.Kind, "cleared")
	}
	assert.Equal(t, BucketArchiveReport{Coordinator: true, Listed: 2, Unknown: 1, Live: 1}, pass())
}

// TestBucketSweepRetention: the bucket-wide pass keeps a deleted
// database's archive for its tier's retention (7 days free, 30 paid).
func TestBucketSweepRetention(t *testing.T) {
	ctx := context.Background()
	store := s3Archive(t)
	th := hbHost(t, func(c *Config) {
		c.History = sweepHistory(store)
	})
	th.cat.setAccount(fsm.Account{ID: "paid", Tier: fsm.TierPaid})
	th.cat.setAccount(fsm.Account{ID: "free", Tier: fsm.TierFree})
	paid, free := newDB("paid"), newDB("free")
	for _, d := range []db{paid, free} {
		th.mustInit(t, d)
		th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
		th.archivedUpTo(t, d)
		_, err := th.Delete(ctx, d.obj, 2)
		require.NoError(t, err)
	}
	th.cat.mu.Lock()
	for _, d := range []db{paid, free} {
		th.cat.dbs[d.uuid] = deletedState(d, th.clock.Now().UnixNano())
	}
	th.cat.hostList = []fsm.Host{{ID: "host-1", State: fsm.HostStateActive}}
	th.cat.mu.Unlock()
	objects := func(d db) int { return archivedObjects(t, store, d) }
	pass := func() BucketArchiveReport {
		t.Helper()
		rep, err := th.hist.sweepBucketArchives(ctx, th.Host)
		require.NoError(t, err)
		return rep
	}
	th.clock.Advance(6 * 24 * time.Hour)
	assert.Equal(t, BucketArchiveReport{Coordinator: true, Listed: 2, NotDue: 2}, pass())
	th.clock.Advance(2 * 24 * time.Hour)
	_, err := th.hist.markDeletes(ctx, th.Host) // the delete markers are in (written in the background after each delete)
	require.NoError(t, err)
	n := objects(free)
	assert.Equal(t, BucketArchiveReport{Coordinator: true, Listed: 2, NotDue: 1, Due: 1, Deleted: 1, Objects: n}, pass())
	assert.Zero(t, objects(free))
	assert.NotZero(t, objects(paid))
	th.clock.Advance(23 * 24 * time.Hour)
	rep := pass()
	assert.Equal(t, 1, rep.Deleted)
	assert.Zero(t, objects(paid))
}

// sweepHistory is a host's history into store for the sweep tests: quick
// shipping, no background sweeps (the tests run the passes).
func sweepHistory(store history.Store) *HistoryConfig {
	return &HistoryConfig{Store: store, Shipper: history.ShipperOptions{MaxLag: 50 * time.Millisecond}, SweepInterval: -1}
}

// deletedState is d as the catalog answers it once deleted at (Unix ns).
func deletedState(d db, at int64) fsm.HeartbeatState {
	return fsm.HeartbeatState{UUID: d.uuid, Known: true, State: fsm.StateDeleted, AccountID: d.account, RoutingGeneration: 2, DeletedAt: at}
}

// archivedObjects counts d's objects in the archive.
func archivedObjects(t *testing.T, store history.Store, d db) int {
	t.Helper()
	keys, err := store.List(context.Background(), d.uuid+"/")
	require.NoError(t, err)
	return len(keys)
}
