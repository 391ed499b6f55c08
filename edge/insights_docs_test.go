package edge

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// insightsDocSection returns the "Query insights" section of docs/api.md.
func insightsDocSection(t *testing.T) string {
	_, self, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(self), "..", "docs", "api.md"))
	require.NoError(t, err)
	doc := string(b)
	i := strings.Index(doc, "\n## Query insights")
	require.GreaterOrEqual(t, i, 0, "docs/api.md lost its insights section")
	sec := doc[i+1:]
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	return sec
}

// fenced returns the contents of the section's blocks fenced ```lang.
func fenced(sec, lang string) []string {
	var out []string
	for _, part := range strings.Split(sec, "```"+lang+"\n")[1:] {
		end := strings.Index(part, "```")
		if end >= 0 {
			out = append(out, part[:end])
		}
	}
	return out
}

// TestInsightsDocExample replays the insights curl example of docs/api.md
// against an edge whose source holds the documented shape, and checks the
// answer is the documented JSON and the documented facts are the code's.
func TestInsightsDocExample(t *testing.T) {
	sec := insightsDocSection(t)
	e, src := newInsightsEnv(t)
	d := e.create(acctA, tokA, "docs")
	src.shapes = []QueryShape{{Hash: 42, Text: "SELECT * FROM orders WHERE customer = ? ORDER BY created DESC LIMIT ?",
		Queries: 16, Errors: 1, RowsRead: 13000, DurationUs: 29440, MaxDurationUs: 4100}}

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
	assert.Equal(t, insightsCall{acctA, d.UUID, e.clock.Now().Add(-7 * 24 * time.Hour), ShapeByAvgRowsRead, 1, true}, calls[0])

	flat := strings.Join(strings.Fields(sec), " ")
	_, perr := parseInsightsQuery(url.Values{"sortBy": {"rows"}})
	require.Error(t, perr)
	for _, fact := range []string{
		perr.Error(),
		insightsNoSourceText, insightsUnavailableText,
		fmt.Sprintf("`Retry-After: %d`", int(insightsRetryNoSource/time.Second)),
		fmt.Sprintf("`Retry-After: %d`", int(insightsRetryDown/time.Second)),
		fmt.Sprintf("no answer within %d s", int(insightsTimeout/time.Second)),
		fmt.Sprintf("| `limit` | 1 to %d | `%d` |", insightsMaxLimit, insightsDefaultLimit),
	} {
		assert.Contains(t, flat, fact, "docs/api.md states %q", fact)
	}
	var doc struct {
		Result []map[string]any `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(jsons[0]), &doc))
	for k := range doc.Result[0] {
		assert.Contains(t, flat, "`"+k+"`", "the field list names %s", k)
	}
}
