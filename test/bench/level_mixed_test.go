package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/internal/pki"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
	"github.com/shoaldb/shoal/test/harness"
)

// TestCatalogLevelMixedVersions checks the catalog-level gate across real
// builds: three voter processes with mutual TLS, c2 and c3 of this build,
// c1 of another build from before catalog levels (SHOAL_BENCH_BASELINE_BIN,
// e.g. main at 224a588). c1 bootstraps (two nodes of this build alone would
// raise the level at once, and c1 could then no longer join), then is
// restarted until it is a follower. While c1 runs the old build the leader
// keeps the cluster at level 1 (c1 answers /v1/cluster/self without
// build_level), and delete_database_if — a level-2 command — is refused,
// whichever node it is sent to, and the three backups stay identical.
// Then c1 is "upgraded" (kill -9, restarted with this build on the same
// data): the leader raises the level within a round or two, the same
// delete applies, and the three backups are identical again.
//
//	git -C /work/main worktree add /tmp/base 224a588 && cd /tmp/base && go build -o /tmp/base/shoal ./cmd/shoal
//	SHOAL_BENCH_BASELINE_BIN=/tmp/base/shoal go test ./test/bench -run TestCatalogLevelMixedVersions -v -count=1
//
// (With the old build as the leader the new nodes' checks cannot help: a
// build from before levels that knows delete_database_if proposes and
// applies it; `shoal cluster resurrected --delete` refuses up front
// because such a leader reports no level. Not covered here.)
func TestCatalogLevelMixedVersions(t *testing.T) {
	oldBin := os.Getenv("SHOAL_BENCH_BASELINE_BIN")
	if oldBin == "" {
		t.Skip("set SHOAL_BENCH_BASELINE_BIN to a shoal binary of a build from before catalog levels")
	}
	ctx := context.Background()
	ports := newPortAlloc(t)
	p := harness.NewPKI(t)
	dir := t.TempDir()
	ops := p.HTTPClient(t, "ops", pki.RoleOperator)
	var addrs []string
	var procs []*harness.Proc
	for i := range 3 {
		bin := shoalBin.Path(t)
		if i == 0 {
			bin = oldBin
		}
		id := fmt.Sprintf("c%d", i+1)
		addr := ports.next()
		args := []string{"raftmeta", "serve", "--id", id, "--dir", filepath.Join(dir, id), "--raft-addr", ports.next(),
			"--http-addr", addr, "--log-level", "warn"}
		if i == 0 {
			args = append(args, "--bootstrap")
		} else {
			args = append(args, "--join", addrs[0])
		}
		proc := harness.StartProc(t, bin, id, append(args, p.Args(t, id, pki.RoleCatalog)...)...)
		harness.WaitHTTP200With(t, ops, "https://"+addr+"/readyz", 30*time.Second, "catalog %s never ready: %s", id, proc.Log)
		addrs = append(addrs, addr)
		procs = append(procs, proc)
	}
	tlsL := p.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator)
	cl, err := raftmeta.NewClient(addrs[1:], raftmeta.WithCacheTTL(0), raftmeta.WithTLS(tlsL))
	require.NoError(t, err)
	defer cl.Close()
	admin := func(a string) *raftmeta.Admin {
		return raftmeta.NewAdmin(a, 30*time.Second, p.Loader(t, "ops", pki.RoleOperator))
	}
	// c1 (old) leads after bootstrapping: restart it until another leads.
	for attempt := 0; ; attempt++ {
		var st raftmeta.ClusterStatus
		require.Eventually(t, func() bool {
			st, err = admin(addrs[1]).Status(ctx)
			return err == nil && st.Leader != ""
		}, 30*time.Second, 200*time.Millisecond, "no leader")
		if st.Leader != "c1" {
			break
		}
		require.Less(t, attempt, 5, "c1 keeps winning the election")
		procs[0].Restart(t, 3*time.Second)
		harness.WaitHTTP200With(t, ops, "https://"+addrs[0]+"/readyz", 30*time.Second, "c1 never ready after a restart: %s", procs[0].Log)
	}

	_, err = cl.RegisterHost(ctx, fsm.RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: fsm.HostStateActive})
	require.NoError(t, err)
	_, err = cl.CreateAccount(ctx, fsm.CreateAccount{ID: "acct", Name: "acct", Tier: fsm.TierPaid,
		Limits: fsm.Limits{MaxDatabases: 1 << 20, MaxStorageBytes: 1 << 50, MaxDatabaseBytes: 1 << 30}})
	require.NoError(t, err)
	var dbs []fsm.CreateDatabase
	for i := range 20 {
		d := fsm.CreateDatabase{UUID: ids.New(), AccountID: "acct", Name: fmt.Sprintf("db-%d", i), ObjectID: ids.New(), HostID: "h1", Region: "weur"}
		_, err := cl.CreateDatabase(ctx, d)
		require.NoError(t, err)
		dbs = append(dbs, d)
	}
	del := func(d fsm.CreateDatabase) fsm.DeleteDatabaseIf {
		return fsm.DeleteDatabaseIf{AccountID: d.AccountID, UUID: d.UUID, ExpectObjectID: d.ObjectID, ExpectRoutingGeneration: 1}
	}

	// Two level rounds (10 s each) with the old build in the group.
	time.Sleep(21 * time.Second)
	st, err := admin(addrs[1]).Status(ctx) // c1 (old) knows no levels
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.ClusterLevel)
	for _, m := range st.Members {
		want := fsm.BuildLevel
		if m.ID == "c1" {
			want = 1 // no build_level in its answer
		}
		assert.Equal(t, want, m.BuildLevel, "member %s", m.ID)
	}
	_, err = cl.DeleteDatabaseIf(ctx, del(dbs[0]))
	require.ErrorIs(t, err, fsm.ErrClusterLevelTooLow)
	assert.Contains(t, err.Error(), "upgrade every catalog node to a build that knows level 2 first")
	// Through the old follower: it forwards, the leader refuses (the old
	// build passes on a refusal code it does not know as it can).
	oldCl, err := raftmeta.NewClient(addrs[:1], raftmeta.WithCacheTTL(0), raftmeta.WithTLS(tlsL))
	require.NoError(t, err)
	defer oldCl.Close()
	_, err = oldCl.DeleteDatabaseIf(ctx, del(dbs[1]))
	require.Error(t, err)
	t.Logf("delete_database_if through the old follower: %v", err)
	requireSameBackups(t, ctx, addrs, admin)
	for _, a := range addrs { // neither delete applied anywhere
		d, err := raftmeta.NewClient([]string{a}, raftmeta.WithCacheTTL(0), raftmeta.WithTLS(tlsL))
		require.NoError(t, err)
		for _, db := range dbs[:2] {
			got, err := d.Database(ctx, db.UUID, raftmeta.LinearizableRead())
			require.NoError(t, err)
			assert.Equal(t, fsm.StateActive, got.State, "at %s", a)
		}
		d.Close()
	}

	// Upgrade c1 in place.
	procs[0].Bin = shoalBin.Path(t)
	procs[0].Restart(t, 0)
	harness.WaitHTTP200With(t, ops, "https://"+addrs[0]+"/readyz", 30*time.Second, "c1 never ready after the upgrade: %s", procs[0].Log)
	require.Eventually(t, func() bool {
		for _, a := range addrs {
			st, err := admin(a).Status(ctx)
			if err != nil || st.ClusterLevel != fsm.BuildLevel {
				return false
			}
		}
		return true
	}, 60*time.Second, 500*time.Millisecond, "the catalog level never rose to this build's on every node")
	for _, d := range dbs[:2] {
		got, err := cl.DeleteDatabaseIf(ctx, del(d))
		require.NoError(t, err)
		assert.Equal(t, fsm.StateDeleted, got.State)
	}
	requireSameBackups(t, ctx, addrs, admin)
}

// requireSameBackups restores every node's backup into this build's FSM
// and requires identical dumps.
func requireSameBackups(t *testing.T, ctx context.Context, addrs []string, admin func(string) *raftmeta.Admin) {
	t.Helper()
	// Every node has applied what the first one has (a linearizable
	// barrier runs before each backup).
	var dumps []string
	for i, a := range addrs {
		var buf bytes.Buffer
		idx, _, err := admin(a).Backup(ctx, &buf)
		require.NoError(t, err)
		f, err := fsm.New(t.TempDir())
		require.NoError(t, err)
		require.NoError(t, f.Restore(io.NopCloser(&buf)))
		d, err := f.Dump(ctx)
		require.NoError(t, err)
		f.Close()
		t.Logf("c%d: backup at index %d, dump %d bytes", i+1, idx, len(d))
		dumps = append(dumps, d)
	}
	for i := 1; i < len(dumps); i++ {
		if dumps[i] != dumps[0] {
			t.Fatalf("c1 and c%d hold different catalogs: %s", i+1, firstDumpDiff(dumps[0], dumps[i]))
		}
	}
}

// TestCatalogBatchEntryMixedVersions checks batch entries (catalog level 3)
// across real builds: three voter processes with mutual TLS, c1 of a build
// of level 2 (SHOAL_BENCH_BASELINE_BIN, e.g. main at 7401cbf: it would
// refuse a batch entry as a malformed command while the others applied
// it), c2 and c3 of this build. While c1 runs that build the cluster stays
// at level 2 and concurrent batched writes (/v1/apply-batch, 8 creates
// each, a refusal among them) reach the log one entry per command: no
// replica of this build is handed a batch entry, and the three backups are
// identical. Then c1 is upgraded in place (kill -9, this build on the same
// data): the level rises to 3, the same writes go as batch entries on every
// replica, and the backups are identical again.
//
//	git -C /work/main worktree add /tmp/base 7401cbf && cd /tmp/base && go build -o /tmp/base/shoal ./cmd/shoal
//	SHOAL_BENCH_BASELINE_BIN=/tmp/base/shoal go test ./test/bench -run TestCatalogBatchEntryMixedVersions -v -count=1
func TestCatalogBatchEntryMixedVersions(t *testing.T) {
	oldBin := os.Getenv("SHOAL_BENCH_BASELINE_BIN")
	if oldBin == "" {
		t.Skip("set SHOAL_BENCH_BASELINE_BIN to a shoal binary of catalog level 2 (before batch entries)")
	}
	ctx := context.Background()
	ports := newPortAlloc(t)
	p := harness.NewPKI(t)
	dir := t.TempDir()
	ops := p.HTTPClient(t, "ops", pki.RoleOperator)
	var addrs []string
	var procs []*harness.Proc
	for i := range 3 {
		bin := shoalBin.Path(t)
		if i == 0 {
			bin = oldBin
		}
		id := fmt.Sprintf("c%d", i+1)
		addr := ports.next()
		args := []string{"raftmeta", "serve", "--id", id, "--dir", filepath.Join(dir, id), "--raft-addr", ports.next(),
			"--http-addr", addr, "--log-level", "warn"}
		if i == 0 {
			args = append(args, "--bootstrap")
		} else {
			args = append(args, "--join", addrs[0])
		}
		proc := harness.StartProc(t, bin, id, append(args, p.Args(t, id, pki.RoleCatalog)...)...)
		harness.WaitHTTP200With(t, ops, "https://"+addr+"/readyz", 30*time.Second, "catalog %s never ready: %s", id, proc.Log)
		addrs = append(addrs, addr)
		procs = append(procs, proc)
	}
	tlsL := p.Loader(t, "bench", pki.RoleEdge, pki.RoleOperator)
	cl, err := raftmeta.NewClient(addrs, raftmeta.WithCacheTTL(0), raftmeta.WithTLS(tlsL))
	require.NoError(t, err)
	defer cl.Close()
	admin := func(a string) *raftmeta.Admin {
		return raftmeta.NewAdmin(a, 30*time.Second, p.Loader(t, "ops", pki.RoleOperator))
	}
	metric := func(a, name string) (string, bool) {
		resp, err := ops.Get("https://" + a + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				return v, true
			}
		}
		return "", false
	}
	levels := func() []int64 {
		var out []int64
		for _, a := range addrs {
			st, err := admin(a).Status(ctx)
			require.NoError(t, err)
			out = append(out, st.ClusterLevel)
		}
		return out
	}
	// The old build leads after bootstrapping; a leader of this build is
	// what would propose batch entries, so restart c1 until another leads.
	for attempt := 0; ; attempt++ {
		var st raftmeta.ClusterStatus
		require.Eventually(t, func() bool {
			st, err = admin(addrs[1]).Status(ctx)
			return err == nil && st.Leader != ""
		}, 30*time.Second, 200*time.Millisecond, "no leader")
		if st.Leader != "c1" {
			break
		}
		require.Less(t, attempt, 5, "c1 keeps winning the election")
		procs[0].Restart(t, 3*time.Second)
		harness.WaitHTTP200With(t, ops, "https://"+addrs[0]+"/readyz", 30*time.Second, "c1 never ready after a restart: %s", procs[0].Log)
	}
	_, err = cl.RegisterHost(ctx, fsm.RegisterHost{ID: "h1", Address: "10.0.0.1:1", State: fsm.HostStateActive})
	require.NoError(t, err)
	_, err = cl.CreateAccount(ctx, fsm.CreateAccount{ID: "acct", Name: "acct", Tier: fsm.TierPaid,
		Limits: fsm.Limits{MaxDatabases: 1 << 20, MaxStorageBytes: 1 << 50, MaxDatabaseBytes: 1 << 30}})
	require.NoError(t, err)

	// 8 writers, each sending batches of 7 creates and one name taken.
	var seq atomic.Int64
	write := func(d time.Duration) (ok, refused int64) {
		var wg sync.WaitGroup
		var okN, refN atomic.Int64
		end := time.Now().Add(d)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					var dbs []fsm.CreateDatabase
					for range 7 {
						dbs = append(dbs, fsm.CreateDatabase{UUID: ids.New(), AccountID: "acct",
							Name: fmt.Sprintf("db-%d", seq.Add(1)), ObjectID: ids.New(), HostID: "h1", Region: "weur"})
					}
					dup := dbs[0]
					dup.UUID, dup.ObjectID = ids.New(), ids.New()
					dbs = append(dbs, dup)
					_, errs := cl.CreateDatabases(ctx, dbs)
					for i, err := range errs {
						switch {
						case i < 7 && err == nil:
							okN.Add(1)
						case i == 7 && errors.Is(err, fsm.ErrNameTaken):
							refN.Add(1)
						default:
							t.Errorf("command %d: %v", i, err)
						}
					}
				}
			}()
		}
		wg.Wait()
		return okN.Load(), refN.Load()
	}

	// Two level rounds (10 s each) with the level-2 build in the group.
	time.Sleep(21 * time.Second)
	assert.Equal(t, []int64{2, 2, 2}, levels())
	ok, refused := write(5 * time.Second)
	t.Logf("level 2: %d creates, %d refused", ok, refused)
	require.Positive(t, ok)
	for _, a := range addrs[1:] {
		v, found := metric(a, "shoal_raftmeta_fsm_batch_entries_total")
		require.True(t, found, "%s: no batch entry metric", a)
		assert.Equal(t, "0", v, "%s was handed a batch entry at level 2", a)
	}
	requireSameBackups(t, ctx, addrs, admin)

	// Upgrade c1 in place.
	procs[0].Bin = shoalBin.Path(t)
	procs[0].Restart(t, 0)
	harness.WaitHTTP200With(t, ops, "https://"+addrs[0]+"/readyz", 30*time.Second, "c1 never ready after the upgrade: %s", procs[0].Log)
	require.Eventually(t, func() bool {
		l := levels()
		return l[0] == 3 && l[1] == 3 && l[2] == 3
	}, 60*time.Second, 500*time.Millisecond, "the catalog level never rose to 3 on every node")
	ok, refused = write(5 * time.Second)
	t.Logf("level 3: %d creates, %d refused", ok, refused)
	require.Positive(t, ok)
	requireSameBackups(t, ctx, addrs, admin)
	for _, a := range addrs {
		v, found := metric(a, "shoal_raftmeta_fsm_batch_entries_total")
		require.True(t, found, "%s: no batch entry metric", a)
		n, err := strconv.ParseFloat(v, 64)
		require.NoError(t, err)
		assert.Positive(t, n, "%s applied no batch entry at level 3", a)
		t.Logf("%s: %s batch entries", a, v)
	}
}
