package dump

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// TestImportBench (SHOAL_BENCH=1) measures ImportDB — sqlexec's sandboxed
// writer, with rows_written counters — against a baseline measured in the
// same run: the same statements executed by a plain mattn connection in
// one transaction, with no authorizer and no counters (what the old
// import connection did, minus its Go authorizer).
func TestImportBench(t *testing.T) {
	if os.Getenv("SHOAL_BENCH") != "1" {
		t.Skip("set SHOAL_BENCH=1")
	}
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("CREATE TABLE big(id INTEGER PRIMARY KEY, n INTEGER, r REAL, s TEXT, b BLOB);\n")
	rng := rand.New(rand.NewSource(1))
	buf := make([]byte, 300)
	const rows = 30_000
	for i := 0; i < rows; i++ {
		rng.Read(buf)
		fmt.Fprintf(&b, "INSERT INTO big VALUES(%d,%d,%v,'%x',X'%x');\n", i, rng.Int63(), rng.Float64(), buf[:200], buf[200:])
	}
	b.WriteString("CREATE INDEX big_n ON big(n);\n")
	in := b.String()
	mb := float64(len(in)) / 1e6

	for round := 1; round <= 3; round++ {
		// Baseline: plain connection, one transaction.
		base := openDB(filepath.Join(dir, fmt.Sprintf("base%d.db", round)), false)
		start := time.Now()
		conn, err := base.Conn(context.Background())
		require.NoError(t, err)
		_, err = conn.ExecContext(context.Background(), "PRAGMA journal_mode=WAL")
		require.NoError(t, err)
		_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
		require.NoError(t, err)
		sp := NewSplitter(bufio.NewReader(strings.NewReader(in)), 64<<20)
		for {
			st, err := sp.Next()
			if err != nil {
				break
			}
			if !st.Blank {
				_, err = conn.ExecContext(context.Background(), st.Raw)
				require.NoError(t, err)
			}
		}
		_, err = conn.ExecContext(context.Background(), "COMMIT")
		require.NoError(t, err)
		baseDur := time.Since(start)
		conn.Close()
		base.Close()

		db, err := sqlexec.Open(filepath.Join(dir, fmt.Sprintf("sx%d.db", round)), sqlexec.Options{})
		require.NoError(t, err)
		start = time.Now()
		res, err := ImportDB(context.Background(), db, strings.NewReader(in), ImportOptions{})
		require.NoError(t, err)
		dur := time.Since(start)
		require.NoError(t, db.Close())
		require.Equal(t, int64(rows), res.RowsWritten) // CREATE INDEX at the end writes no counted rows
		t.Logf("round %d: %.1f MB, %d statements: ImportDB %.2f s (%.1f MB/s), plain connection %.2f s (%.1f MB/s), ratio ImportDB/plain time %.2f",
			round, mb, res.Statements, dur.Seconds(), mb/dur.Seconds(), baseDur.Seconds(), mb/baseDur.Seconds(), dur.Seconds()/baseDur.Seconds())
	}
}
