// Package chinsights serves the edge's query insights from ClickHouse: it
// adapts chsink.Store (the pipeline's usage tables) to edge.InsightsSource.
// It is a package of its own so that package edge imports no ClickHouse
// driver; whatever builds an edge with analytics (shoal dev, an edge
// process, the tests) imports this one.
package chinsights

import (
	"context"
	"fmt"
	"time"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/pipeline/chsink"
)

// Source reads top query shapes from a chsink.Store. It is safe for
// concurrent use (the Store is); it does not own the Store, whose Close
// stays with the caller.
type Source struct {
	st *chsink.Store
}

var _ edge.InsightsSource = (*Source)(nil)

// NewSource returns a Source reading st.
func NewSource(st *chsink.Store) *Source { return &Source{st: st} }

// orders maps the edge's orders onto chsink's (the same seven).
var orders = map[edge.ShapeOrder]chsink.ShapeOrder{
	edge.ShapeByDuration:       chsink.ByDuration,
	edge.ShapeByRowsRead:       chsink.ByRowsRead,
	edge.ShapeByRowsWritten:    chsink.ByRowsWritten,
	edge.ShapeByCount:          chsink.ByCount,
	edge.ShapeByAvgDuration:    chsink.ByAvgDuration,
	edge.ShapeByAvgRowsRead:    chsink.ByAvgRowsRead,
	edge.ShapeByAvgRowsWritten: chsink.ByAvgRowsWritten,
}

// TopShapes implements edge.InsightsSource with chsink.Store.TopShapes,
// which deduplicates redelivered events and scopes shape texts to the
// account.
func (s *Source) TopShapes(ctx context.Context, accountID, databaseUUID string, since time.Time, order edge.ShapeOrder, limit int) ([]edge.QueryShape, error) {
	o, ok := orders[order]
	if !ok {
		return nil, fmt.Errorf("chinsights: unknown order %v", order)
	}
	if limit < 1 {
		return nil, fmt.Errorf("chinsights: limit %d < 1", limit)
	}
	stats, err := s.st.TopShapes(ctx, accountID, databaseUUID, since, o, limit)
	if err != nil {
		return nil, err
	}
	out := make([]edge.QueryShape, len(stats))
	for i, st := range stats {
		out[i] = edge.QueryShape{Hash: st.ShapeHash, Text: st.Shape, Queries: st.Queries, Errors: st.Errors,
			RowsRead: st.RowsRead, RowsWritten: st.RowsWritten, DurationUs: st.DurationUs, MaxDurationUs: st.MaxDurationUs}
	}
	return out, nil
}
