package chsink

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/shoaldb/shoal/pipeline/chlocal"
	"github.com/shoaldb/shoal/pipeline/chlocal/chtest"
	"github.com/shoaldb/shoal/pipeline/event"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// requireCH returns the package's shared server (chtest): tests that stop
// ClickHouse start their own.
func requireCH(t *testing.T) *chlocal.Server { t.Helper(); return chtest.Require(t) }

var nonIdent = regexp.MustCompile(`[^A-Za-z0-9_]`)

// openStore opens a Store on a database of the test's own.
func openStore(t *testing.T, ch *chlocal.Server) *Store {
	t.Helper()
	db := "t_" + strings.ToLower(nonIdent.ReplaceAllString(t.Name(), "_"))
	st, err := Open(StoreConfig{Options: ch.Options(), Database: db})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	require.NoError(t, st.Conn().Exec(ctx, "DROP DATABASE IF EXISTS "+db))
	require.NoError(t, st.EnsureSchema(ctx))
	return st
}

// stopMerges stops background merges on the store's tables, so rows
// inserted twice stay stored twice and every read must deduplicate itself
// (otherwise a merge could hide a read that counts a duplicate).
func stopMerges(t *testing.T, st *Store) {
	t.Helper()
	for _, tbl := range Tables() {
		require.NoError(t, st.Conn().Exec(context.Background(), "SYSTEM STOP MERGES "+st.Database()+"."+tbl))
	}
}

const testPartitions = 8

// startBroker starts a one-node kfake cluster on 127.0.0.1:port (0: any)
// with the usage topic, persisting to dir when not empty.
func startBroker(t *testing.T, port int, dir string) *kfake.Cluster {
	t.Helper()
	opts := []kfake.Opt{kfake.Ports(port), kfake.SeedTopics(testPartitions, event.TopicUsage)}
	if dir != "" {
		opts = append(opts, kfake.DataDir(dir))
	}
	c, err := kfake.NewCluster(opts...)
	require.NoError(t, err)
	return c
}

func brokerPort(t *testing.T, c *kfake.Cluster) int {
	_, p, err := net.SplitHostPort(c.ListenAddrs()[0])
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// produce writes events to the usage topic keyed by account, as the
// pipeline producer does, and waits for every acknowledgement.
func produce(t *testing.T, addr string, events []event.Usage) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ProducerLinger(5*time.Millisecond),
		kgo.DefaultProduceTopic(event.TopicUsage))
	require.NoError(t, err)
	defer cl.Close()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for i := range events {
		b, err := event.Encode(events[i])
		require.NoError(t, err)
		wg.Add(1)
		cl.Produce(context.Background(), &kgo.Record{Key: []byte(events[i].AccountID), Value: b}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NoError(t, first)
}

// truth is the ground truth of a set of events: per UTC day and account,
// and per (account, database, shape hash).
type truth struct {
	days   map[string]map[string]Totals // "2006-01-02" → account → totals
	shapes map[[3]string]ShapeStats     // {account, database, hash} → stats
}

func newTruth() *truth {
	return &truth{days: map[string]map[string]Totals{}, shapes: map[[3]string]ShapeStats{}}
}

func (tr *truth) add(u event.Usage) {
	d := dayString(Day(u.WindowStart))
	if tr.days[d] == nil {
		tr.days[d] = map[string]Totals{}
	}
	a := tr.days[d][u.AccountID]
	a.Events++
	a.Queries += u.Queries
	a.Errors += u.Errors
	a.RowsRead += u.RowsRead
	a.RowsWritten += u.RowsWritten
	a.DurationUs += u.DurationUs
	tr.days[d][u.AccountID] = a
	k := [3]string{u.AccountID, u.DatabaseUUID, strconv.FormatUint(u.ShapeHash, 10)}
	s := tr.shapes[k]
	s.ShapeHash, s.Shape = u.ShapeHash, u.Shape
	s.Queries += u.Queries
	s.Errors += u.Errors
	s.RowsRead += u.RowsRead
	s.RowsWritten += u.RowsWritten
	s.DurationUs += u.DurationUs
	s.MaxDurationUs = max(s.MaxDurationUs, u.MaxDuration)
	tr.shapes[k] = s
}

// genEvents makes n usage events from one producer with distinct
// sequences starting at seq0, over accounts, databases and shapes, with
// windows on both sides of a UTC midnight (so day assignment is tested).
func genEvents(rng *rand.Rand, n int, producer string, seq0 uint64, accounts int) []event.Usage {
	midnight := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	out := make([]event.Usage, n)
	for i := range out {
		acct := rng.IntN(accounts)
		db := rng.IntN(4)
		shape := rng.IntN(6)
		start := midnight + (rng.Int64N(600)-300)*1000 // 5 minutes either side
		q := 1 + rng.Int64N(50)
		out[i] = event.Usage{
			V:            event.Version,
			EventID:      event.ID{Producer: producer, Seq: seq0 + uint64(i)},
			Host:         "host-" + strconv.Itoa(rng.IntN(3)),
			AccountID:    fmt.Sprintf("acct-%03d", acct),
			DatabaseUUID: fmt.Sprintf("db-%03d-%d", acct, db),
			Shape:        fmt.Sprintf("SELECT * FROM t%d WHERE id = ?", shape),
			ShapeHash:    uint64(1000 + shape),
			WindowStart:  start,
			WindowEnd:    start + 1000,
			Queries:      q,
			Errors:       rng.Int64N(2),
			RowsRead:     q * rng.Int64N(1000),
			RowsWritten:  q * rng.Int64N(10),
			DurationUs:   q * (10 + rng.Int64N(500)),
			MaxDuration:  10 + rng.Int64N(5000),
		}
	}
	return out
}

func truthOf(events ...[]event.Usage) *truth {
	tr := newTruth()
	seen := map[event.ID]bool{}
	for _, evs := range events {
		for _, u := range evs {
			if !seen[u.EventID] {
				seen[u.EventID] = true
				tr.add(u)
			}
		}
	}
	return tr
}

func startSink(t *testing.T, addr string, st *Store, group string, mod func(*Config)) *Sink {
	t.Helper()
	cfg := Config{
		Brokers:       []string{addr},
		Group:         group,
		Store:         st,
		MaxBatch:      2_000,
		FlushInterval: 100 * time.Millisecond,
		RetryMin:      50 * time.Millisecond,
		RetryMax:      500 * time.Millisecond,
		ClientOptions: []kgo.Opt{
			kgo.SessionTimeout(6 * time.Second), // kfake's minimum; a crashed member is noticed quickly
			kgo.HeartbeatInterval(500 * time.Millisecond),
			kgo.RetryTimeout(2 * time.Minute),
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// dbTotals reads every account's totals per day from ClickHouse.
func dbTotals(t *testing.T, st *Store, tr *truth) map[string]map[string]Totals {
	t.Helper()
	got := map[string]map[string]Totals{}
	for d := range tr.days {
		day, err := time.Parse("2006-01-02", d)
		require.NoError(t, err)
		rows, err := st.AccountsOver(context.Background(), day, -1, -1)
		require.NoError(t, err)
		got[d] = map[string]Totals{}
		for _, r := range rows {
			got[d][r.AccountID] = r.Totals
		}
	}
	return got
}

func equalTotals(a, b map[string]map[string]Totals) bool {
	if len(a) != len(b) {
		return false
	}
	for d, am := range a {
		bm := b[d]
		if len(am) != len(bm) {
			return false
		}
		for k, v := range am {
			if bm[k] != v {
				return false
			}
		}
	}
	return true
}

// requireExact waits until ClickHouse's totals equal the truth and every
// sink is idle (nothing pending, no lag), then checks once more: a
// double count that lands late cannot hide behind a moment of equality.
func requireExact(t *testing.T, st *Store, tr *truth, timeout time.Duration, sinks ...*Sink) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := dbTotals(t, st, tr)
		idle := true
		for _, s := range sinks {
			stt := s.Stats()
			idle = idle && stt.Lag == 0 && stt.OldestPendingMs == 0
		}
		if idle && equalTotals(got, tr.days) {
			break
		}
		if time.Now().After(deadline) {
			require.Equal(t, tr.days, got, "ClickHouse totals never equalled the ground truth")
		}
		time.Sleep(100 * time.Millisecond) // poll interval of a wait for the condition above (the event itself)
	}
	time.Sleep(500 * time.Millisecond) // a window for a late duplicate to show (an absence: nothing to wait on)
	require.Equal(t, tr.days, dbTotals(t, st, tr), "totals moved after they were exact")
	// The limiter's per-account question agrees with the all-accounts one.
	for d, accts := range tr.days {
		day, _ := time.Parse("2006-01-02", d)
		for a, want := range accts {
			got, err := st.TotalsForAccountDay(context.Background(), a, day)
			require.NoError(t, err)
			require.Equal(t, want, got, "account %s day %s", a, d)
			break // one per day is enough here; TestQueries covers the helper
		}
	}
}
