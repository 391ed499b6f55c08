package objecthost

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

// fsmCatalog is a Catalog backed by a real catalog state machine (SQLite,
// every command applied as Raft would apply it, minus replication): the
// digests the host compares against are the ones the catalog maintains.
// It records which UUIDs were sent per database and the digest calls.
type fsmCatalog struct {
	t *testing.T
	f *fsm.FSM

	mu          sync.Mutex
	index       uint64
	now         int64
	perUUID     map[string]int
	digestCalls int
	unsupported bool // answer digest calls as a catalog of the previous build
}

var (
	_ Catalog       = (*fsmCatalog)(nil)
	_ DigestCatalog = (*fsmCatalog)(nil)
)

func newFSMCatalog(t *testing.T) *fsmCatalog {
	f, err := fsm.New(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	c := &fsmCatalog{t: t, f: f, now: 1_780_000_000_000_000_000, perUUID: map[string]int{}}
	l := fsm.Limits{MaxDatabases: 1 << 30, MaxStorageBytes: 1 << 40, MaxDatabaseBytes: 1 << 30}
	c.must(fsm.CmdCreateAccount, fsm.CreateAccount{ID: "acct", Name: "acct", Tier: fsm.TierPaid, Limits: l})
	for _, h := range []string{"host-1", "host-2"} {
		c.must(fsm.CmdRegisterHost, fsm.RegisterHost{ID: h, Address: "127.0.0.1:1", Region: "weur", State: fsm.HostStateActive})
	}
	return c
}

func (c *fsmCatalog) apply(typ fsm.CommandType, body any) fsm.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	c.now += 1_000_000
	cmd, err := fsm.NewCommand(typ, fmt.Sprintf("rid-%d", c.index), c.now, body)
	require.NoError(c.t, err)
	data, err := json.Marshal(cmd)
	require.NoError(c.t, err)
	r, ok := c.f.Apply(&raft.Log{Index: c.index, Term: 1, Type: raft.LogCommand, Data: data}).(fsm.Result)
	require.True(c.t, ok)
	return r
}

func (c *fsmCatalog) must(typ fsm.CommandType, body any) fsm.Result {
	r := c.apply(typ, body)
	require.Nil(c.t, r.Err, "%s: %v", typ, r.Err)
	return r
}

func (c *fsmCatalog) Heartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	c.mu.Lock()
	for _, u := range uuids {
		c.perUUID[u]++
	}
	c.mu.Unlock()
	return c.f.Heartbeat(ctx, uuids)
}

func (c *fsmCatalog) ConfirmHeartbeat(ctx context.Context, uuids []string) (fsm.HeartbeatAnswer, error) {
	return c.f.Heartbeat(ctx, uuids)
}

func (c *fsmCatalog) HeartbeatDigests(ctx context.Context, q fsm.DigestQuery) (fsm.DigestAnswer, error) {
	c.mu.Lock()
	c.digestCalls++
	old := c.unsupported
	c.mu.Unlock()
	if old {
		return fsm.DigestAnswer{}, ErrDigestsUnsupported
	}
	return c.f.HeartbeatDigests(ctx, q)
}

func (c *fsmCatalog) FenceOrphans(_ context.Context, hostID string, uuids []string) (fsm.FenceAnswer, error) {
	r := c.must(fsm.CmdFenceOrphans, fsm.FenceOrphans{HostID: hostID, UUIDs: uuids})
	var a fsm.FenceAnswer
	require.NoError(c.t, json.Unmarshal(r.Value, &a))
	return a, nil
}

func (c *fsmCatalog) RegisterHost(context.Context, fsm.RegisterHost) error     { return nil }
func (c *fsmCatalog) ReportHostLoad(context.Context, fsm.ReportHostLoad) error { return nil }

// sent returns and resets the UUIDs sent per database since the last call.
func (c *fsmCatalog) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for u := range c.perUUID {
		out = append(out, u)
	}
	c.perUUID = map[string]int{}
	sort.Strings(out)
	return out
}

// digestHost is a host whose catalog is an fsmCatalog.
func digestHost(t *testing.T, mod func(*Config)) (*testHost, *fsmCatalog) {
	cat := newFSMCatalog(t)
	th := newTestHost(t, func(c *Config) {
		c.Catalog = cat
		c.HeartbeatInterval = 30 * time.Second
		if mod != nil {
			mod(c)
		}
	})
	return th, cat
}

// create runs the create flow: init on the host, the catalog row, confirm.
func create(t *testing.T, th *testHost, cat *fsmCatalog, n int) []db {
	var out []db
	for i := 0; i < n; i++ {
		d := newDB("acct")
		req := d.init()
		req.RoutingGeneration = 1
		_, err := th.Init(context.Background(), d.obj, req)
		require.NoError(t, err)
		cat.must(fsm.CmdCreateDatabase, fsm.CreateDatabase{UUID: d.uuid, AccountID: "acct", Name: "n-" + d.uuid[24:],
			ObjectID: d.obj, HostID: th.cfg.ID, Region: "weur", ReadReplication: fsm.ReadReplicationDisabled})
		_, err = th.Confirm(context.Background(), d.obj, 1)
		require.NoError(t, err)
		out = append(out, d)
	}
	return out
}

// hostQuery is every non-empty bucket of the host's digests.
func hostQuery(th *testHost) fsm.DigestQuery {
	q := fsm.DigestQuery{HostID: th.cfg.ID}
	for b := 0; b < fsm.DigestBuckets; b++ {
		if d := th.digests.bucket(b); d.Count != 0 || d.Digest != 0 {
			q.Buckets = append(q.Buckets, d)
		}
	}
	return q
}

func requireDigestsEqual(t *testing.T, th *testHost, cat *fsmCatalog, what string) {
	t.Helper()
	q := hostQuery(th)
	ans, err := cat.f.HeartbeatDigests(context.Background(), q)
	require.NoError(t, err)
	assert.Empty(t, ans.Differ, "%s: buckets differ", what)
}

// runAll makes every object due and runs one pass.
func runAll(th *testHost) HeartbeatReport {
	th.clock.Advance(34 * time.Second) // interval + the largest jitter (a tenth)
	return th.RunHeartbeats(context.Background())
}

// TestHostDigestsEqualTheCatalogs: the host's per-bucket digests, kept as
// metadata changes, equal the catalog's after creates, deletes, a
// relocation away (once the host retired its object) and a restart.
func TestHostDigestsEqualTheCatalogs(t *testing.T) {
	th, cat := digestHost(t, nil)
	dbs := create(t, th, cat, 60)
	require.NotEmpty(t, hostQuery(th).Buckets)
	requireDigestsEqual(t, th, cat, "creates")

	for _, d := range dbs[:5] {
		cat.must(fsm.CmdDeleteDatabase, fsm.DeleteDatabase{AccountID: "acct", UUID: d.uuid})
		_, err := th.Delete(context.Background(), d.obj, 0)
		require.NoError(t, err)
	}
	requireDigestsEqual(t, th, cat, "deletes")

	// Relocated to host-2 (lost-host recovery): the catalog's digest of
	// host-1 lost it, the host has not yet learned.
	moved := dbs[10]
	cat.must(fsm.CmdRelocateDatabase, fsm.RelocateDatabase{UUID: moved.uuid, FromObjectID: moved.obj, ObjectID: newObjectID(), HostID: "host-2"})
	ans, err := cat.f.HeartbeatDigests(context.Background(), hostQuery(th))
	require.NoError(t, err)
	assert.Equal(t, []int{fsm.DigestBucket(moved.uuid)}, ans.Differ)
	rep := runAll(th)
	assert.Equal(t, 1, rep.Superseded, "retired through its per-database heartbeat")
	requireDigestsEqual(t, th, cat, "relocation")

	th.reopen(t)
	requireDigestsEqual(t, th, cat, "restart")
}

// TestDigestMismatchHeartbeatsExactlyThatBucket: with every bucket equal no
// database is looked up individually; after a delete the host was not told
// of, exactly the due databases of that bucket are, and the host learns the
// delete from that per-database answer.
func TestDigestMismatchHeartbeatsExactlyThatBucket(t *testing.T) {
	th, cat := digestHost(t, nil)
	dbs := create(t, th, cat, 200)
	rep := runAll(th) // first beats (phase) of everything, unconfirmed none
	cat.sent()
	rep = runAll(th)
	assert.Equal(t, 200, rep.DigestMatched)
	assert.Equal(t, 0, rep.Sent, "no per-database heartbeat")
	assert.Equal(t, 1, rep.DigestCalls)
	assert.Empty(t, cat.sent())

	gone := dbs[17]
	cat.must(fsm.CmdDeleteDatabase, fsm.DeleteDatabase{AccountID: "acct", UUID: gone.uuid}) // the host is not told
	var want []string
	for _, d := range dbs {
		if fsm.DigestBucket(d.uuid) == fsm.DigestBucket(gone.uuid) {
			want = append(want, d.uuid)
		}
	}
	sort.Strings(want)
	rep = runAll(th)
	assert.Equal(t, want, cat.sent(), "per-database heartbeats of exactly that bucket")
	assert.Equal(t, 1, rep.DigestDiffer)
	assert.Equal(t, 1, rep.Deleted)
	info, err := th.Info(context.Background(), gone.obj)
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, info.State, "the deleted database learned it from its heartbeat")
	requireDigestsEqual(t, th, cat, "after learning")

	rep = runAll(th)
	assert.Empty(t, cat.sent())
	assert.Equal(t, 199, rep.DigestMatched)
}

// TestOrphanStillDiesWithDigests: an object whose create never reached the
// catalog makes its bucket differ; its per-database heartbeat answers
// unknown, the confirmation and the fence follow, and it is deleted — the
// verdict comes from those answers, not from the digest.
func TestOrphanStillDiesWithDigests(t *testing.T) {
	th, cat := digestHost(t, func(c *Config) { c.CreationGrace = time.Minute })
	create(t, th, cat, 30)
	orphan := newDB("acct")
	th.mustInit(t, orphan) // the edge's catalog write never happened
	runAll(th)
	rep := runAll(th)
	assert.Equal(t, 1, rep.OrphansKilled)
	info, err := th.Info(context.Background(), orphan.obj)
	require.NoError(t, err)
	assert.Equal(t, StateDeleted, info.State)
	requireDigestsEqual(t, th, cat, "after the orphan died")
}

// TestUnconfirmedObjectsStillConfirmAndPublish: an object whose confirm was
// lost goes through the per-database heartbeat whatever its bucket says,
// which confirms it and republishes its route.
func TestUnconfirmedObjectsStillConfirmAndPublish(t *testing.T) {
	th, cat := digestHost(t, nil)
	create(t, th, cat, 20)
	d := newDB("acct")
	req := d.init()
	req.RoutingGeneration = 1
	_, err := th.Init(context.Background(), d.obj, req)
	require.NoError(t, err)
	cat.must(fsm.CmdCreateDatabase, fsm.CreateDatabase{UUID: d.uuid, AccountID: "acct", Name: "unconfirmed",
		ObjectID: d.obj, HostID: th.cfg.ID, Region: "weur", ReadReplication: fsm.ReadReplicationDisabled})
	requireDigestsEqual(t, th, cat, "unconfirmed but equal")
	before := len(th.sink.Routes())
	rep := runAll(th)
	assert.Equal(t, []string{d.uuid}, cat.sent(), "only the unsettled object per database")
	assert.Equal(t, 20, rep.DigestMatched)
	_, m, err := th.lookup(d.obj)
	require.NoError(t, err)
	assert.True(t, m.Confirmed, "confirmed by its per-database heartbeat")
	routes := th.sink.Routes()[before:]
	require.Len(t, routes, 1, "route published by the heartbeat")
	assert.Equal(t, d.uuid, routes[0].DatabaseUUID)
}

// TestDigestsFallBackForAnOldCatalog: a catalog without the call (by type,
// or answering ErrDigestsUnsupported) gets per-database heartbeats of every
// due database, and the host asks for digests again only after
// digestRetryAfter.
func TestDigestsFallBackForAnOldCatalog(t *testing.T) {
	th, cat := digestHost(t, nil)
	dbs := create(t, th, cat, 50)
	cat.unsupported = true
	runAll(th)
	cat.sent()
	rep := runAll(th)
	assert.Len(t, cat.sent(), len(dbs), "every due database per database")
	assert.Zero(t, rep.DigestCalls, "not asked again within digestRetryAfter")
	assert.Equal(t, 1, cat.digestCalls, "asked until refused, then not")

	cat.unsupported = false
	th.clock.Advance(digestRetryAfter)
	rep = runAll(th)
	assert.Equal(t, 1, rep.DigestCalls)
	assert.Equal(t, len(dbs), rep.DigestMatched)
}

// TestRaftmetaCatalogMapsAnOldNodesAnswer: a catalog node of the previous
// build answers /v1/heartbeat/digests with its not-found handler (404,
// code not_found); the adapter turns that into ErrDigestsUnsupported.
func TestRaftmetaCatalogMapsAnOldNodesAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = fmt.Fprintf(w, `{"error":{"code":%q,"message":"no such endpoint: %s"}}`, fsm.CodeNotFound, r.URL.Path)
	}))
	defer srv.Close()
	cl, err := raftmeta.NewClient([]string{srv.Listener.Addr().String()})
	require.NoError(t, err)
	defer cl.Close()
	_, err = RaftmetaCatalog{C: cl}.HeartbeatDigests(context.Background(), fsm.DigestQuery{HostID: "host-1"})
	assert.ErrorIs(t, err, ErrDigestsUnsupported)
}

// TestDigestAnswerCarriesCatalogRestores: a host whose buckets all match
// sends no per-database heartbeat, so the catalog's restore count must
// reach it in the digest answer — else, after a catalog restored from an
// older backup, its databases would never republish their sizes and the
// catalog would keep the backup's.
func TestDigestAnswerCarriesCatalogRestores(t *testing.T) {
	th, cat := digestHost(t, nil)
	dbs := create(t, th, cat, 20)
	for _, d := range dbs[:5] {
		th.exec(t, d, "CREATE TABLE t (x)") // an empty file has no size to publish
	}
	runAll(th)
	runAll(th) // every bucket matches from here on
	before := len(th.sink.Sizes())

	cat.must(fsm.CmdCatalogRestored, fsm.CatalogRestored{})
	rep := runAll(th)
	assert.Equal(t, 0, rep.Sent, "no per-database heartbeat: only the digest answer carried the restore")
	assert.Equal(t, 20, rep.DigestMatched)
	got := th.sink.Sizes()[before:]
	assert.Len(t, got, 5, "every database with a size published it again after the restore")

	rep = runAll(th)
	assert.Len(t, th.sink.Sizes(), before+5, "once per restore")
	assert.Equal(t, 20, rep.DigestMatched)
}
