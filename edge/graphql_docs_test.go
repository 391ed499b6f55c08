package edge

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docSection returns the section of docs/api.md whose heading starts with
// title.
func docSection(t *testing.T, title string) string {
	_, self, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), "..", "docs", "api.md"))
	require.NoError(t, err)
	doc := string(b)
	i := strings.Index(doc, "\n## "+title)
	require.GreaterOrEqual(t, i, 0, "docs/api.md lost its section %q", title)
	sec := doc[i+1:]
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	return sec
}

// TestGraphQLDocExample replays the GraphQL curl example of docs/api.md
// against an edge whose source holds the documented hour, and checks the
// answer is the documented JSON and the documented limits are the code's.
func TestGraphQLDocExample(t *testing.T) {
	sec := docSection(t, "GraphQL analytics")
	e, src := newAnalyticsEnv(t)
	d := e.create(acctA, tokA, "docs")
	e.clock.Advance(time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC).Sub(e.clock.Now()))
	hour := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	src.hours[acctA+"/"+d.UUID] = []HourUsage{{Hour: hour, ReadQueries: 120, WriteQueries: 8, RowsRead: 5400, RowsWritten: 16, DurationUs: 900}}

	curls := fenced(sec, "bash")
	require.Len(t, curls, 1)
	line := strings.ReplaceAll(strings.TrimSpace(curls[0]), "\\\n", " ")
	vars := map[string]string{"EDGE": e.ts.URL, "ACCOUNT_ID": acctA, "TOKEN": tokA, "DATABASE_ID": d.UUID}
	c := parseCurl(t, shellWords(t, line, vars))
	req, err := http.NewRequest(c.method, c.url, strings.NewReader(c.data))
	require.NoError(t, err)
	for _, h := range c.headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "%s", raw)
	jsons := fenced(sec, "json")
	require.Len(t, jsons, 1)
	assert.JSONEq(t, jsons[0], string(raw), "the documented answer is the real one")
	calls := src.taken()
	require.Len(t, calls, 1)
	assert.Equal(t, analyticsCall{method: "hours", account: acctA, database: d.UUID,
		from: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC), to: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}, calls[0])

	flat := strings.Join(strings.Fields(sec), " ")
	for _, fact := range []string{
		"`limit` (required, 1 to 10000)", "at most 31 days", "over 64 KiB",
		gqlCodeParse, gqlCodeValidation, gqlCodeForbidden, gqlCodeUnavailable, gqlCodeAuth, gqlCodeRateLimited, gqlCodeBadRequest,
	} {
		assert.Contains(t, flat, fact, "docs/api.md states %q", fact)
	}
	assert.Equal(t, 10000, gqlMaxLimit)
	assert.Equal(t, 64<<10, gqlMaxBody)
	assert.Equal(t, 31*24*time.Hour, gqlMaxRange)
	for _, f := range []string{"readQueries", "writeQueries", "rowsRead", "rowsWritten", "queryBatchTimeMs", "sampleInterval", "datetimeHour", "date", "databaseId"} {
		assert.Contains(t, flat, f)
	}
	for o := range queryOrders {
		_, field, _ := strings.Cut(o, "_")
		if o != "count" {
			assert.Contains(t, flat, field, "ordering %s is documented", o)
		}
	}
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(jsons[0]), &doc))
}
