package test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every time.Sleep in a test says why, on its line or the line above:
// docs/test-time.md triages them (a sleep that waits for an event should
// wait on the event; one that makes time pass for a time-driven loop
// should move an injected clock; the rest are kept with the reason). A
// new sleep without a reason fails here.
func TestEverySleepInATestSaysWhy(t *testing.T) {
	const sleepCall = "time." + "Sleep(" // split, or this line would count
	root := ".."
	var bare []string
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "vendor" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		prev, line := "", 0
		for sc.Scan() {
			line++
			text := sc.Text()
			code, _, commented := strings.Cut(text, "//")
			if strings.Contains(code, sleepCall) {
				n++
				if !commented && !strings.HasPrefix(strings.TrimSpace(prev), "//") {
					bare = append(bare, filepath.ToSlash(path)+":"+strconv.Itoa(line))
				}
			}
			prev = text
		}
		return sc.Err()
	})
	require.NoError(t, err)
	require.Positive(t, n, "found the tests")
	assert.Empty(t, bare, "sleeps without a reason (a comment on the line or the line above; see docs/test-time.md)")
	t.Logf("%d sleeps in tests", n)
}
