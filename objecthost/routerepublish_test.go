package objecthost

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRepublishRoutes: a deleted route whose publication failed (which
// heartbeats skip) is published by the dirty retry; the full pass
// republishes every confirmed route, active and deleted, never an
// unconfirmed one; a broker that keeps failing stops the pass early and
// leaves the routes dirty for the next retry.
func TestRepublishRoutes(t *testing.T) {
	th := newTestHost(t, nil)
	ctx := context.Background()
	active, gone, pending := newDB("a"), newDB("a"), newDB("a")
	for _, d := range []db{active, gone, pending} {
		th.mustInit(t, d)
	}
	for _, d := range []db{active, gone} {
		_, err := th.Confirm(ctx, d.obj, 1)
		require.NoError(t, err)
	}
	th.sink.FailRoutes(1)
	_, err := th.Delete(ctx, gone.obj, 2)
	require.NoError(t, err)
	r, _ := th.sink.LastRoute(gone.uuid)
	require.Equal(t, StateActive, r.State, "the deleted route's publication failed")

	p, f := th.RepublishRoutes(ctx, false, 0)
	assert.Equal(t, 1, p)
	assert.Zero(t, f)
	r, _ = th.sink.LastRoute(gone.uuid)
	assert.Equal(t, StateDeleted, r.State, "the dirty retry published the delete")
	assert.EqualValues(t, 2, r.Generation)
	p, _ = th.RepublishRoutes(ctx, false, 0)
	assert.Zero(t, p, "nothing dirty any more")

	n := len(th.sink.Routes())
	p, f = th.RepublishRoutes(ctx, true, 1000)
	assert.Equal(t, 2, p, "every confirmed route, the deleted one included")
	assert.Zero(t, f)
	for _, r := range th.sink.Routes()[n:] {
		assert.NotEqual(t, pending.uuid, r.DatabaseUUID, "an unconfirmed database has no route")
	}

	// The broker is down: the pass stops after republishStopAfter failures.
	more := make([]db, 5)
	for i := range more {
		more[i] = newDB("b")
		th.mustInit(t, more[i])
		_, err := th.Confirm(ctx, more[i].obj, 1)
		require.NoError(t, err)
	}
	th.sink.FailRoutes(100)
	p, f = th.RepublishRoutes(ctx, true, 0)
	assert.Zero(t, p)
	assert.Equal(t, republishStopAfter, f)
	th.sink.FailRoutes(0)
	p, f = th.RepublishRoutes(ctx, false, 0)
	assert.Equal(t, republishStopAfter, p, "the failed ones stayed dirty and the retry took them")
	assert.Zero(t, f)
}
