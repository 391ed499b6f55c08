package objecthost

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v4 "github.com/shoaldb/shoal/internal/v4"
	"github.com/shoaldb/shoal/objecthost/history"
)

// downStore is a store whose reads and listings fail like an S3 that
// answers 503 while down is set.
type downStore struct {
	history.Store
	down atomic.Bool
}

func (s *downStore) List(ctx context.Context, prefix string) ([]string, error) {
	if s.down.Load() {
		return nil, errSlowDown
	}
	return s.Store.List(ctx, prefix)
}

func (s *downStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if s.down.Load() {
		return nil, errSlowDown
	}
	return s.Store.Get(ctx, key)
}

// waitDamage waits for the background archive check a refusal queued
// (restoredamage.go) to reach cond.
func waitDamage(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 10*time.Millisecond, what)
}

// segmentHolding is the key of d's archived segment that holds txid.
func segmentHolding(t *testing.T, store history.Store, d db, txid uint64) string {
	t.Helper()
	for _, k := range archived(t, store, d, ".seg") {
		var first, last, ts uint64
		if _, err := fmt.Sscanf(strings.TrimSuffix(path.Base(k), ".seg"), "%016x-%016x-%016x", &first, &last, &ts); err == nil && first <= txid && txid <= last {
			return k
		}
	}
	t.Fatalf("no segment holds txid %d: %v", txid, archived(t, store, d, ".seg"))
	return ""
}

// spoilObject deletes key, or overwrites it with one bit flipped (an S3
// overwrite behind the host's back).
func spoilObject(t *testing.T, store history.Store, key, how string) {
	t.Helper()
	ctx := context.Background()
	if how == "deleted" {
		require.NoError(t, store.Delete(ctx, key))
		return
	}
	r, err := store.Get(ctx, key)
	require.NoError(t, err)
	b, err := io.ReadAll(r)
	r.Close()
	require.NoError(t, err)
	b[len(b)/2] ^= 0x40
	require.NoError(t, store.Put(ctx, key, bytes.NewReader(b), int64(len(b))))
}

// TestRestoreToDamagedPoint: the archive (gofakes3 over HTTP) loses or
// damages the segment a time-travel restore, an export at a bookmark and a
// fork need. Each answers 400 7400 naming the records that no longer
// restore and the newest earlier point that does, not 500; the database
// keeps its content; the refusals are counted and archive_damaged rises
// (the restore's check heals the current point); after that a restore to
// a point before the damage works and is undone by its previous bookmark.
// The newest segment lost: a restore to it is refused the same way, and a
// restore elsewhere is refused with 503 until the heal made the undo point
// restorable again. A store that is down answers 503, never 400.
func TestRestoreToDamagedPoint(t *testing.T) {
	for _, how := range []string{"deleted", "corrupted", "newest-deleted", "store-down"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			store := &downStore{Store: s3Archive(t)}
			th := historyHost(t, store)
			srv := serve(t, th)
			c := srv.Client()
			d := newDB("acct")
			th.mustInit(t, d)
			th.exec(t, d, "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r INTEGER DEFAULT (random()))")
			th.exec(t, d, "INSERT INTO t(v) VALUES ('one')")
			rows1 := th.rowsOf(t, d)
			b1 := th.archivedUpTo(t, d)
			th.clock.Advance(time.Second)
			th.exec(t, d, "INSERT INTO t(v) VALUES ('two')")
			b2 := th.archivedUpTo(t, d)
			th.clock.Advance(time.Second)
			th.exec(t, d, "INSERT INTO t(v) VALUES ('three')")
			b3 := th.archivedUpTo(t, d)
			th.clock.Advance(time.Second)
			th.exec(t, d, "INSERT INTO t(v) VALUES ('four')")
			b4 := th.archivedUpTo(t, d)
			rows3 := th.rowsOf(t, d) // the current content (with 'four')
			p2, err := history.ParseBookmark(d.uuid, history.Bookmark(b2))
			require.NoError(t, err)
			p3, err := history.ParseBookmark(d.uuid, history.Bookmark(b3))
			require.NoError(t, err)
			p4, err := history.ParseBookmark(d.uuid, history.Bookmark(b4))
			require.NoError(t, err)

			base := "/v1/objects/" + d.obj
			restore := func(bm string) (int, envelope) {
				t.Helper()
				return call(t, c, srv, "POST", base+"/time_travel/restore?bookmark="+url.QueryEscape(bm), &d, nil)
			}
			refused := func(status int, env envelope, wantStatus int, what ...string) {
				t.Helper()
				require.Equal(t, wantStatus, status, "%+v", env)
				require.False(t, env.Success)
				require.Len(t, env.Errors, 1)
				for _, w := range what {
					assert.Contains(t, env.Errors[0].Message, w)
				}
			}
			damagedNow := func(op string) float64 {
				return testutil.ToFloat64(th.hist.sm.restoreDamaged.WithLabelValues(op))
			}

			if how == "store-down" {
				store.down.Store(true)
				status, env := restore(b2)
				refused(status, env, http.StatusServiceUnavailable, "retry")
				assert.Equal(t, v4.CodeUnavailable, env.Errors[0].Code)
				assert.Equal(t, rows3, th.rowsOf(t, d))
				assert.Zero(t, damagedNow("restore"), "an outage is not damage")
				fork := newDB("acct")
				req := fork.init()
				req.RestoreFrom = &RestoreSource{DatabaseUUID: d.uuid, Bookmark: b2}
				_, err := th.Init(ctx, fork.obj, req)
				require.ErrorIs(t, err, history.ErrStoreFailed)
				st, code, _ := statusOf(err)
				assert.Equal(t, http.StatusServiceUnavailable, st, "a fork's init during an outage: retryable")
				assert.Equal(t, v4.CodeUnavailable, code)
				return
			}

			if how == "newest-deleted" {
				// The last two points' segments (the heal's snapshot is of
				// the current point, b4: b3 stays lost).
				k3, k4 := segmentHolding(t, store, d, p3.Txid), segmentHolding(t, store, d, p4.Txid)
				spoilObject(t, store, k3, "deleted")
				if k4 != k3 {
					spoilObject(t, store, k4, "deleted")
				}
				// The archive checks these refusals queue wait (scrubOne
				// takes archiveMu) until both answers are in: before the
				// heal.
				th.hist.archiveMu.Lock()
				// An export at a lost point: 400 at once, not "not archived
				// yet, retry" (503) for ever.
				status, env := call(t, c, srv, "POST", base+"/export", &d, map[string]any{"bookmark": b3})
				refused(status, env, http.StatusBadRequest, "can no longer be restored", "nothing was exported")
				// A restore elsewhere could not be undone: 503, nothing
				// changed.
				status, env = restore(b1)
				th.hist.archiveMu.Unlock()
				refused(status, env, http.StatusServiceUnavailable, "nothing was changed", "retry")
				assert.Equal(t, rows3, th.rowsOf(t, d))
				// The check queued by that refusal heals the current point.
				waitDamage(t, "archive_damaged after the heal", func() bool {
					st := th.ScrubStatus()
					return len(st.Damaged) == 1 && st.Damaged[0].HealedAt != ""
				})
				status, env = restore(b3)
				refused(status, env, http.StatusBadRequest, "can no longer be restored", p3.Gen, "nothing was changed", b2)
				assert.Equal(t, v4.CodeInvalidRequest, env.Errors[0].Code)
				assert.Equal(t, rows3, th.rowsOf(t, d))
			} else {
				spoilObject(t, store, segmentHolding(t, store, d, p2.Txid), how)
				status, env := restore(b2)
				refused(status, env, http.StatusBadRequest, "can no longer be restored", p2.Gen, "nothing was changed: the database keeps its current content")
				assert.Equal(t, v4.CodeInvalidRequest, env.Errors[0].Code)
				assert.Contains(t, env.Errors[0].Message, "newest earlier point that restores is bookmark")
				assert.Equal(t, rows3, th.rowsOf(t, d), "the database keeps its content")
				assert.Equal(t, 1.0, damagedNow("restore"))
				waitDamage(t, "archive_damaged", func() bool { return len(th.ScrubStatus().Damaged) == 1 })

				// An export at the bookmark.
				status, env = call(t, c, srv, "POST", base+"/export", &d, map[string]any{"bookmark": b2})
				refused(status, env, http.StatusBadRequest, "can no longer be restored", "nothing was exported")
				assert.Equal(t, 1.0, damagedNow("export"))

				// A fork at the bookmark (the init of a new object).
				fork := newDB("acct")
				req := fork.init()
				req.RestoreFrom = &RestoreSource{DatabaseUUID: d.uuid, Bookmark: b2}
				_, err := th.Init(ctx, fork.obj, req)
				require.ErrorIs(t, err, history.ErrDamaged)
				st, code, msg := statusOf(err)
				assert.Equal(t, http.StatusBadRequest, st)
				assert.Equal(t, v4.CodeInvalidRequest, code)
				assert.Contains(t, msg, "no database was created")
				assert.Equal(t, 1.0, damagedNow("fork"))
			}
			alarms := th.Alarms()
			require.Len(t, alarms, 1)
			assert.Equal(t, "archive_damaged", alarms[0].Kind)

			// A point before the damage restores, and the restore is
			// undone by its previous bookmark (the heal made the current
			// point restorable).
			waitDamage(t, "the heal", func() bool {
				st := th.ScrubStatus()
				return len(st.Damaged) == 1 && st.Damaged[0].HealedAt != ""
			})
			status, env := restore(b1)
			require.Equal(t, http.StatusOK, status, "%+v", env)
			var res RestoreResult
			require.NoError(t, json.Unmarshal(env.Result, &res))
			assert.Equal(t, rows1, th.rowsOf(t, d))
			th.clock.Advance(time.Second)
			status, env = restore(res.PreviousBookmark)
			require.Equal(t, http.StatusOK, status, "%+v", env)
			assert.Equal(t, rows3, th.rowsOf(t, d), "undone")
		})
	}
}
