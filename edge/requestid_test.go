package edge

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Request IDs the edge makes are version 4 UUIDs in canonical form, sane
// by the edge's own rule (so a client may send them back), and do not
// repeat.
func TestNewRequestIDIsRandomUUIDv4(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := newRequestID()
		u, err := uuid.Parse(id)
		require.NoError(t, err, id)
		assert.Equal(t, uuid.Version(4), u.Version(), id)
		assert.Equal(t, uuid.RFC4122, u.Variant(), id)
		assert.Equal(t, u.String(), id, "canonical form")
		assert.True(t, saneRequestID(id), id)
		require.False(t, seen[id], "repeated %s", id)
		seen[id] = true
	}
}
