package robustness

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/test/robustness/validate"
)

// sizesByValue must fail on a database whose catalog size is not its pages
// in use, and on an account total that is not their sum.
func TestSizesByValue(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, n int) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, make([]byte, n), 0o600))
		return p
	}
	a := file("a.db", 8192)
	b := file("b.db", 4096)
	inUse := map[string]int64{a: 12288, b: 4096} // a: its WAL's pages included
	used := func(o validate.Object) (int64, error) { return inUse[o.Path], nil }
	objs := []validate.Object{
		{Host: "h1", DatabaseUUID: "a", AccountID: "acct", State: "active", Path: a},
		{Host: "h2", DatabaseUUID: "b", AccountID: "acct", State: "active", Path: b},
		{Host: "h2", DatabaseUUID: "c", AccountID: "acct", State: "active", Path: filepath.Join(dir, "never-opened.db")},
		{Host: "h2", DatabaseUUID: "d", AccountID: "acct", State: "deleted", Path: b},
		{Host: "h2", DatabaseUUID: "e", AccountID: "other", State: "active", Path: b},
	}
	measured := map[string]int64{"a": 12288, "b": 4096}
	r := sizesByValue(objs, map[string]int64{"a": 12288, "b": 4096}, 16384, measured, "acct", used)
	assert.True(t, r.OK(), "%s", r)
	assert.Equal(t, 3, r.Checked)
	r = sizesByValue(objs, map[string]int64{"a": 8192, "b": 4096}, 16384, measured, "acct", used)
	assert.Len(t, r.Violations, 1, "a's size other than its pages in use: %s", r)
	r = sizesByValue(objs, map[string]int64{"a": 12288, "b": 4096}, 20480, measured, "acct", used)
	assert.Len(t, r.Violations, 1, "a total that is not the files' sum: %s", r)
	r = sizesByValue(objs, map[string]int64{"a": 12288}, 12288, measured, "acct", used)
	assert.Len(t, r.Violations, 2, "b without a size (and the total short of it): %s", r)
}
