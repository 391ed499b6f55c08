package history

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An object store that loses or corrupts an object it acknowledged (a
// segment deleted or overwritten behind the host's back). The shipper does
// not notice (finding it is the scrubber's job: scrub_test.go and
// objecthost/scrub.go), and goes on shipping after the hole. Whatever
// reads the archive — Verify, a time-travel restore, a lost host's
// recovery — fails with ErrCorrupt when it needs the lost records, never
// building a wrong database; a point before the hole still restores
// exactly.
func TestArchiveObjectLostBehindTheHostsBack(t *testing.T) {
	ctx := context.Background()
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	e := newEnv(t, store, CaptureOptions{CheckpointFrames: 8}, ShipperOptions{SnapshotMinBytes: 1 << 40})
	e.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
	var points []Position
	for batch := 0; batch < 3; batch++ {
		for i := 0; i < 20; i++ {
			e.exec("INSERT INTO t(v) VALUES (?)", strings.Repeat("x", 200))
		}
		e.sync() // seals and ships this batch's segment
		points = append(points, e.cap.Current())
	}
	keys, err := store.List(ctx, e.key+"/")
	require.NoError(t, err)
	var segs []string
	for _, k := range keys {
		if strings.HasSuffix(k, ".seg") {
			segs = append(segs, k)
		}
	}
	require.GreaterOrEqual(t, len(segs), 3, "one segment per batch at least: %v", keys)
	_, err = e.archive.Verify(ctx, e.key)
	require.NoError(t, err)

	for _, how := range []string{"deleted", "corrupted"} {
		t.Run(how, func(t *testing.T) {
			// The segment holding the second batch's last commit goes
			// missing, or its first record is damaged.
			var lost string
			for _, k := range segs {
				if n, ok := parseSegName(filepath.Base(k)); ok && n.First <= points[1].Txid && points[1].Txid <= n.Last {
					lost = k
				}
			}
			require.NotEmpty(t, lost)
			path := filepath.Join(store.root, filepath.FromSlash(lost))
			orig, err := os.ReadFile(path)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, os.WriteFile(path, orig, 0o644)) })
			if how == "deleted" {
				require.NoError(t, store.Delete(ctx, lost))
			} else {
				bad := append([]byte(nil), orig...)
				bad[10] ^= 0x40 // the segment's first record
				require.NoError(t, os.WriteFile(path, bad, 0o644))
			}

			// The host writes and ships on, unaware.
			e.exec("INSERT INTO t(v) VALUES ('after')")
			e.sync()

			_, err = e.archive.Verify(ctx, e.key)
			assert.ErrorIs(t, err, ErrCorrupt, "verify finds the hole")
			for _, p := range []Position{points[1], points[2], e.cap.Current()} {
				_, err := e.archive.Restore(ctx, e.key, p, filepath.Join(t.TempDir(), "r.db"))
				assert.ErrorIs(t, err, ErrCorrupt, "a restore to txid %d needs the lost records", p.Txid)
			}
			got := filepath.Join(t.TempDir(), "r.db")
			_, err = e.archive.Restore(ctx, e.key, points[0], got)
			require.NoError(t, err, "a point before the hole")
			conn, err := sql.Open("sqlite3", got)
			require.NoError(t, err)
			defer conn.Close()
			var n int
			require.NoError(t, conn.QueryRow("SELECT count(*) FROM t").Scan(&n))
			assert.Equal(t, 20, n, "exactly the first batch")
		})
	}
}
