package benchenv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestKnobs(t *testing.T) {
	t.Setenv("SHOAL_BENCH_SECONDS", "")
	t.Setenv("SHOAL_BENCH_WORKERS", "")
	d, err := Duration(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, d)
	w, err := Workers(1, 16, 64)
	require.NoError(t, err)
	require.Equal(t, []int{1, 16, 64}, w)

	t.Setenv("SHOAL_BENCH_SECONDS", "2")
	t.Setenv("SHOAL_BENCH_WORKERS", "16, 64")
	d, err = Duration(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, d)
	w, err = Workers(1)
	require.NoError(t, err)
	require.Equal(t, []int{16, 64}, w)

	t.Setenv("SHOAL_BENCH_SECONDS", "soon")
	_, err = Duration(time.Second)
	require.Error(t, err)
	t.Setenv("SHOAL_BENCH_WORKERS", "16,x")
	_, err = Workers(1)
	require.Error(t, err)
}
