package history

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// TestAddRacingShipmentKeepsShipping (issue #13): a new database's first
// open starts a generation whose base snapshot is pending when the capturer
// is handed to the shipper. If Run ships that snapshot while Add is still
// between its listing of the area and its unshipped mark — which a loaded
// host's scheduler allows — the capturer must still ship every later
// commit. Before the fix it never did: the mark Add set after the shipment
// had emptied the area was never cleared, so no append made the database
// dirty again, its records stayed in open.seg, and the shipper reported no
// lag and no backlog while the archive ended at the empty base snapshot
// (the robustness suite's seed 1796271300568204547).
//
// The hook runs, inside Add's window, exactly what a tick of Run does for
// a dirty database (shipOne under its shipState's lock).
func TestAddRacingShipmentKeepsShipping(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	raced := false
	sopts := ShipperOptions{MaxLag: 40 * time.Millisecond}
	sopts.addListed = func(s *Shipper, c *Capturer) {
		s.mu.Lock()
		st := s.dbs[c]
		_, dirty := s.dirty[c]
		s.mu.Unlock()
		if st == nil || !dirty {
			return // not visible to Run yet: no tick can ship it here
		}
		raced = true
		st.mu.Lock()
		defer st.mu.Unlock()
		assert.NoError(t, s.shipOne(context.Background(), c, st, false))
	}
	e := newEnv(t, store, CaptureOptions{}, sopts)
	t.Logf("a tick could ship inside Add's window: %v", raced)

	e.exec("CREATE TABLE t (v INTEGER PRIMARY KEY)")
	for _, v := range []int{2349, 2403, 2467} {
		e.exec("INSERT INTO t (v) VALUES (?)", v)
	}
	cur := e.cap.Current()
	require.EqualValues(t, 4, cur.Txid, "every commit captured")

	// Shipped by the running shipper alone (no Sync): the commits reach
	// the archive within MaxLag while the store answers. The wait is for
	// that event; before the fix it never came.
	ctx := context.Background()
	shipped := func() bool {
		p, err := e.archive.Latest(ctx, e.key)
		return err == nil && p == cur
	}
	deadline := time.Now().Add(10 * time.Second)
	for !shipped() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll for the shipment itself
	}
	p, err := e.archive.Latest(ctx, e.key)
	require.NoError(t, err)
	st := e.ship.Status()
	assert.Equal(t, cur, p, "the archive holds every acknowledged commit (status: backlog %d, lag %s)", st.Backlog, st.Lag)
}

// TestLagFindsUnnotifiedDatabase: the lag measurement covers every
// registered database and makes one with unshipped records dirty again,
// so a lost OnAppend (the way issue #13's database fell out of the dirty
// set) costs a tick, not the archive. The capturer here never notifies
// the shipper at all: only that backstop ships its commits, and until it
// does the lag counts them.
func TestLagFindsUnnotifiedDatabase(t *testing.T) {
	store, err := NewDirStore(t.TempDir())
	require.NoError(t, err)
	dir := t.TempDir()
	path := filepath.Join(dir, "x.db")
	key := "db-lag-unnotified"
	ship := NewShipper(store, ShipperOptions{MaxLag: 40 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	c, err := NewCapturer(key, path, CaptureOptions{StagingDir: filepath.Join(dir, "staging")}) // no OnAppend
	require.NoError(t, err)
	db, err := sqlexec.Open(path, sqlexec.Options{ReadConns: 1})
	require.NoError(t, err)
	require.NoError(t, c.Attach(context.Background(), db))
	ship.Add(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ship.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		_ = db.Close()
		_ = c.Close()
	}()
	archive := NewArchive(store)
	// The base snapshot ships (Add made the database dirty); the shipment
	// that empties the area drops it from the dirty set.
	waitFor(t, 10*time.Second, "the base snapshot shipped", func() bool {
		p, err := archive.Latest(ctx, key)
		ship.mu.Lock()
		_, dirty := ship.dirty[c]
		ship.mu.Unlock()
		return err == nil && p.Gen != "" && !dirty
	})
	for _, q := range []string{"CREATE TABLE t (v INTEGER PRIMARY KEY)", "INSERT INTO t (v) VALUES (2349)", "INSERT INTO t (v) VALUES (2403)"} {
		_, err := execOn(db, q)
		require.NoError(t, err, q)
	}
	cur := c.Current()
	require.EqualValues(t, 3, cur.Txid)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p, err := archive.Latest(ctx, key); err == nil && p == cur {
			break
		}
		time.Sleep(20 * time.Millisecond) // poll for the shipment itself
	}
	p, err := archive.Latest(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, cur, p, "commits never notified are shipped all the same")
}
