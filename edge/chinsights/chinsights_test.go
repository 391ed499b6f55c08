package chinsights

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/edge"
	"github.com/shoaldb/shoal/pipeline/chsink"
)

// Every order the edge can ask for maps to its own chsink order. The
// figures themselves are checked against real ClickHouse by
// test/insights_test.go.
func TestOrdersMapOneToOne(t *testing.T) {
	all := []edge.ShapeOrder{edge.ShapeByDuration, edge.ShapeByRowsRead, edge.ShapeByRowsWritten, edge.ShapeByCount,
		edge.ShapeByAvgDuration, edge.ShapeByAvgRowsRead, edge.ShapeByAvgRowsWritten}
	seen := map[chsink.ShapeOrder]bool{}
	for _, o := range all {
		c, ok := orders[o]
		require.True(t, ok, "%v has no chsink order", o)
		assert.False(t, seen[c], "%v shares chsink order %d", o, c)
		seen[c] = true
	}
	assert.Len(t, orders, len(all))
	assert.Equal(t, chsink.ByAvgRowsWritten, orders[edge.ShapeByAvgRowsWritten])
	assert.Equal(t, chsink.ByCount, orders[edge.ShapeByCount])
}

func TestRefusesBeforeQuerying(t *testing.T) {
	s := NewSource(nil) // never reached
	_, err := s.TopShapes(context.Background(), "a", "d", time.Now(), edge.ShapeOrder(0), 5)
	assert.Error(t, err)
	_, err = s.TopShapes(context.Background(), "a", "d", time.Now(), edge.ShapeByCount, 0)
	assert.Error(t, err)
}
