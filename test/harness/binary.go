package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// shoalPkg is built by import path, so the build does not depend on the
// test's working directory (its package's folder).
const shoalPkg = "github.com/shoaldb/shoal/cmd/shoal"

// Binary is the shoal binary a test process runs as real processes. It is
// built once, on the first Path, and shared by every test of the process:
// the link alone takes seconds. The zero value is ready to use; a test
// package declares one and calls Remove from TestMain after m.Run.
type Binary struct {
	once sync.Once
	dir  string
	path string
	out  []byte
	err  error
}

// Path returns the path of a freshly built shoal binary, or of the prebuilt
// one $SHOAL_TEST_BIN names (e.g. a baseline build from another worktree, to
// show that a test fails on the code it is meant to catch). The build uses
// the process's environment, i.e. the shared build.env (same tags and CGO
// flags, so the Go build cache is reused). A failed build fails t, and every
// later Path of the process. Safe for concurrent use.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		if prebuilt := os.Getenv("SHOAL_TEST_BIN"); prebuilt != "" {
			b.path, b.err = filepath.Abs(prebuilt)
			if b.err == nil {
				_, b.err = os.Stat(b.path)
			}
			b.out = []byte("SHOAL_TEST_BIN=" + prebuilt)
			return
		}
		b.dir, b.err = os.MkdirTemp("", "shoal-bin-")
		if b.err != nil {
			return
		}
		b.path = filepath.Join(b.dir, "shoal")
		cmd := exec.Command("go", "build", "-o", b.path, shoalPkg)
		cmd.Env = os.Environ()
		b.out, b.err = cmd.CombinedOutput()
	})
	require.NoError(t, b.err, "go build: %s", b.out)
	return b.path
}

// Remove deletes what Path built (never a prebuilt $SHOAL_TEST_BIN). Call it
// once, after every test of the process has run.
func (b *Binary) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
