package snapshot

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/internal/ids"
	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/pipeline/chlocal/chtest"
	"github.com/shoaldb/shoal/raftmeta"
	"github.com/shoaldb/shoal/raftmeta/fsm"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// requireCH is the package's shared server (tests that stop ClickHouse
// start their own).
func requireCH(t testing.TB) *chlocal.Server { t.Helper(); return chtest.Require(t) }

func quietLogger() *slog.Logger {
	if os.Getenv("SHOAL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

var nonIdent = regexp.MustCompile(`[^A-Za-z0-9_]`)

// openHistory connects to ch and returns an empty history in a database
// of the test's own, with background merges stopped: rows stored twice stay
// stored twice, so every read has to deduplicate them itself.
func openHistory(t testing.TB, ch *chlocal.Server) *History {
	t.Helper()
	conn, err := clickhouse.Open(ch.Options())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	db := "t_" + strings.ToLower(nonIdent.ReplaceAllString(t.Name(), "_"))
	h, err := NewHistory(conn, db)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db))
	require.NoError(t, h.EnsureSchema(ctx))
	require.NoError(t, conn.Exec(ctx, "SYSTEM STOP MERGES "+db+"."+Table))
	return h
}

// catalog is one real raftmeta node over loopback TCP (Raft, HTTP API,
// fsync) and a client of it.
type catalog struct {
	node   *raftmeta.Node
	client *raftmeta.Client
}

func startCatalog(t testing.TB) *catalog {
	t.Helper()
	n, err := raftmeta.NewNode(raftmeta.Config{ID: "n0", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Bootstrap: true, DrainInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), RaftLogOutput: io.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	require.Eventually(t, n.IsLeader, 15*time.Second, 20*time.Millisecond, "the node never led")
	cl, err := raftmeta.NewClient([]string{n.HTTPAddr()}, raftmeta.WithCacheTTL(0))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &catalog{node: n, client: cl}
}

// populate creates accounts acct-000… with databases spread over them
// (account i gets about weight i+1), plus one account without databases,
// and returns the database UUIDs.
func (c *catalog) populate(t testing.TB, accounts, databases int) []string {
	t.Helper()
	ctx := context.Background()
	for a := 0; a <= accounts; a++ {
		id := fmt.Sprintf("acct-%03d", a)
		if a == accounts {
			id = "acct-empty"
		}
		_, err := c.client.CreateAccount(ctx, fsm.CreateAccount{ID: id, Name: id, Tier: fsm.TierPaid,
			Limits: fsm.Limits{MaxDatabases: int64(databases) + 1, MaxStorageBytes: 1 << 50, MaxDatabaseBytes: 1 << 40}})
		require.NoError(t, err)
	}
	uuids := make([]string, databases)
	owner := make([]string, databases)
	rng := rand.New(rand.NewPCG(1, uint64(databases)))
	for i := range uuids {
		uuids[i] = ids.New()
		owner[i] = fmt.Sprintf("acct-%03d", int(float64(accounts)*(1-rng.Float64()*rng.Float64()))%accounts)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	const workers = 32
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < databases; i += workers {
				_, err := c.client.CreateDatabase(ctx, fsm.CreateDatabase{UUID: uuids[i], AccountID: owner[i],
					Name: fmt.Sprintf("db-%d", i), ObjectID: ids.New(), HostID: "h1", Region: "weur",
					ReadReplication: fsm.ReadReplicationDisabled})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		require.NoError(t, err)
	default:
	}
	return uuids
}

// setSizes records a size for each database (size(i), sequence seq) and
// waits until the account totals have drained.
func (c *catalog) setSizes(t testing.TB, uuids []string, seq int64, size func(i int) int64) {
	t.Helper()
	ctx := context.Background()
	for lo := 0; lo < len(uuids); lo += fsm.MaxStatsPerCommand {
		hi := min(lo+fsm.MaxStatsPerCommand, len(uuids))
		stats := make([]fsm.DatabaseStat, 0, hi-lo)
		for i := lo; i < hi; i++ {
			stats = append(stats, fsm.DatabaseStat{UUID: uuids[i], SizeBytes: size(i), Seq: seq})
		}
		_, err := c.client.SetDatabaseStats(ctx, stats)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		n, err := c.node.FSM().PendingStatsChanges(ctx)
		return err == nil && n == 0
	}, 30*time.Second, 10*time.Millisecond, "account totals never drained")
}

// truth is the catalog's figures, read linearizably page by page from a
// quiet catalog.
type truth struct {
	databases map[string][]DatabaseStorage // account → its databases in UUID order
	accounts  map[string]AccountStorage
	total     int64
	count     int
}

func (c *catalog) truth(t testing.TB) truth {
	t.Helper()
	ctx := context.Background()
	tr := truth{databases: map[string][]DatabaseStorage{}, accounts: map[string]AccountStorage{}}
	after := ""
	for {
		p, err := c.client.DatabaseStoragePage(ctx, after, fsm.MaxStoragePage, raftmeta.LinearizableRead())
		require.NoError(t, err)
		for _, d := range p.Databases {
			tr.databases[d.AccountID] = append(tr.databases[d.AccountID],
				DatabaseStorage{AccountID: d.AccountID, UUID: d.UUID, SizeBytes: d.SizeBytes, Seq: d.Seq})
			tr.total += d.SizeBytes
			tr.count++
		}
		if after = p.Next; after == "" {
			break
		}
	}
	for {
		p, err := c.client.AccountStoragePage(ctx, after, fsm.MaxStoragePage, raftmeta.LinearizableRead())
		require.NoError(t, err)
		for _, a := range p.Accounts {
			tr.accounts[a.AccountID] = AccountStorage{AccountID: a.AccountID, SizeBytes: a.StorageBytes, Databases: a.ActiveDatabases}
		}
		if after = p.Next; after == "" {
			break
		}
	}
	return tr
}

// requireMatches checks that the history's snapshot at or before at holds
// exactly the truth: every database of every account, every account's
// total and count, each account's total the sum of its databases, and the
// distinct rows counted once however many are stored.
func requireMatches(t testing.TB, h *History, tr truth, at time.Time) Counts {
	t.Helper()
	ctx := context.Background()
	accts, err := h.AccountsAt(ctx, at)
	require.NoError(t, err)
	require.Len(t, accts, len(tr.accounts))
	for _, a := range accts {
		want := tr.accounts[a.AccountID]
		want.SnapshotTime = a.SnapshotTime
		require.Equal(t, want, a)
		var sum int64
		for _, d := range tr.databases[a.AccountID] {
			sum += d.SizeBytes
		}
		require.Equal(t, sum, a.SizeBytes, "account %s: total = sum of its databases", a.AccountID)

		dbs, err := h.DatabasesAt(ctx, a.AccountID, at)
		require.NoError(t, err)
		wantDBs := tr.databases[a.AccountID]
		for i := range wantDBs {
			wantDBs[i].SnapshotTime = a.SnapshotTime
		}
		if len(wantDBs) == 0 {
			require.Empty(t, dbs)
		} else {
			require.Equal(t, wantDBs, dbs, "account %s", a.AccountID)
		}
		got, err := h.StorageAt(ctx, a.AccountID, at)
		require.NoError(t, err)
		require.Equal(t, a, got)
	}
	n, err := h.CountsAt(ctx, at)
	require.NoError(t, err)
	require.Equal(t, uint64(tr.count), n.Databases)
	require.Equal(t, uint64(len(tr.accounts)), n.Accounts)
	require.Equal(t, uint64(tr.count+len(tr.accounts)), n.Distinct)
	require.Equal(t, tr.total, n.SizeBytes)
	return n
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func newSnapshotter(t testing.TB, cat *catalog, h *History, mod func(*Config)) *Snapshotter {
	t.Helper()
	cfg := Config{Catalog: cat.client, Conn: h.conn, Database: h.Database(), Logger: quietLogger(),
		RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, AttemptTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}
