package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The shoal binary is built once per test process and shared by every test
// that runs it as a real process: the link alone takes seconds on this
// machine. The build uses the process's environment, i.e. the shared
// build.env (same tags and CGO flags, so the Go build cache is reused).
var shoalBin struct {
	once sync.Once
	dir  string
	path string
	out  []byte
	err  error
}

// buildShoal returns the path of a freshly built shoal binary, or of the
// prebuilt one $SHOAL_TEST_BIN names (e.g. a baseline build from another
// worktree, to show that a test fails on the code it is meant to catch).
func buildShoal(t *testing.T) string {
	t.Helper()
	shoalBin.once.Do(func() {
		if prebuilt := os.Getenv("SHOAL_TEST_BIN"); prebuilt != "" {
			shoalBin.path, shoalBin.err = filepath.Abs(prebuilt)
			if shoalBin.err == nil {
				_, shoalBin.err = os.Stat(shoalBin.path)
			}
			shoalBin.out = []byte("SHOAL_TEST_BIN=" + prebuilt)
			return
		}
		shoalBin.dir, shoalBin.err = os.MkdirTemp("", "shoal-bin-")
		if shoalBin.err != nil {
			return
		}
		shoalBin.path = filepath.Join(shoalBin.dir, "shoal")
		cmd := exec.Command("go", "build", "-o", shoalBin.path, "../cmd/shoal")
		cmd.Env = os.Environ()
		shoalBin.out, shoalBin.err = cmd.CombinedOutput()
	})
	require.NoError(t, shoalBin.err, "go build: %s", shoalBin.out)
	return shoalBin.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shoalBin.dir != "" {
		_ = os.RemoveAll(shoalBin.dir)
	}
	os.Exit(code)
}
