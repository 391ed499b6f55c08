package objecthost

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/shoaldb/shoal/objecthost/sqlexec"
)

// The limits docs/security.md and docs/api.md state are the defaults in the
// code, and the result-size message docs/api.md quotes is the host's.
func TestSecurityDocsMatchDefaults(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return strings.Join(strings.Fields(string(b)), " ")
	}
	sec, api := read("../docs/security.md"), read("../docs/api.md")
	var tl TenantLimits
	tl.setDefaults()
	l := sqlexec.DefaultLimits()
	mib := func(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
	gib := func(n int64) string { return fmt.Sprintf("%d GiB", n>>30) }
	for _, want := range []string{
		fmt.Sprintf("| running / waiting requests per account per host | %d / %d (%d s) |", tl.MaxRunning, tl.MaxWaiting, int(tl.Wait/time.Second)),
		fmt.Sprintf("| results held by a host | %s |", gib(tl.ResultMemory)),
		fmt.Sprintf("| temporary files per query / per host process | %s / %s |", mib(l.MaxTempBytes), gib(tl.MaxTempBytes)),
		fmt.Sprintf("| result size per request | %d MB |", l.MaxResultBytes/1_000_000),
		fmt.Sprintf("| query time | %d s |", int(l.QueryTimeout/time.Second)),
		fmt.Sprintf("| program size | %s instructions |", commas(l.MaxProgramOps)),
		fmt.Sprintf("| value / row size | %d MB |", l.MaxValueBytes/1_000_000),
	} {
		assert.Contains(t, sec, want, "docs/security.md")
	}
	assert.Contains(t, api, fmt.Sprintf("result too large: the query's results would exceed the limit of %d bytes per request", l.MaxResultBytes))
	assert.Contains(t, api, fmt.Sprintf("at most %d requests of one account run at once on a host; up to %d more wait, each at most %d s",
		tl.MaxRunning, tl.MaxWaiting, int(tl.Wait/time.Second)))
}

func commas(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
