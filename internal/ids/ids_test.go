package ids

import (
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestNewIsCanonicalVersion7AndOrdered(t *testing.T) {
	var got []string
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		s := New()
		u, err := uuid.Parse(s)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), u.Version())
		require.Equal(t, s, u.String(), "canonical lower-case form")
		require.False(t, seen[s], "duplicate %s", s)
		seen[s] = true
		got = append(got, s)
		if i%100 == 0 {
			time.Sleep(2 * time.Millisecond) // deliberate: ids spread over several real milliseconds
		}
	}
	// google/uuid keeps version 7 monotonic within the process, so the
	// strings sort in minting order.
	require.True(t, sort.StringsAreSorted(got))
}
