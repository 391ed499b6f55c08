package srvruntime

import (
	"os"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestApplyAndRestore(t *testing.T) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOGC or GOMAXPROCS set in the environment: Apply leaves them alone by design")
	}
	p := runtime.GOMAXPROCS(0)
	gc := debug.SetGCPercent(100)
	defer debug.SetGCPercent(gc)

	restore := Apply(true)
	require.Equal(t, p+1, runtime.GOMAXPROCS(0))
	require.Equal(t, GCPercent, debug.SetGCPercent(GCPercent))
	restore()
	require.Equal(t, p, runtime.GOMAXPROCS(0))
	require.Equal(t, 100, debug.SetGCPercent(100))

	restore = Apply(false)
	require.Equal(t, p, runtime.GOMAXPROCS(0), "no spare P when not asked")
	restore()
}

func TestEnvironmentWins(t *testing.T) {
	t.Setenv("GOGC", "50")
	t.Setenv("GOMAXPROCS", "7")
	p := runtime.GOMAXPROCS(0)
	gc := debug.SetGCPercent(123)
	defer debug.SetGCPercent(gc)
	defer Apply(true)()
	require.Equal(t, p, runtime.GOMAXPROCS(0))
	require.Equal(t, 123, debug.SetGCPercent(123))
}
