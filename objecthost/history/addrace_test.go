package history

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
