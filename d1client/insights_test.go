package d1client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInsights(t *testing.T) {
	var got []url.Values
	var paths []string
	down := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, paths = append(got, r.URL.Query()), append(paths, r.Method+" "+r.URL.Path)
		assert.Equal(t, "Bearer tok", r.Header.Get("Authorization"))
		if down {
			w.Header().Set("Retry-After", "5")
			fail(w, http.StatusServiceUnavailable, 7503, "Query insights are temporarily unavailable")
			return
		}
		ok(w, []any{map[string]any{"query": "SELECT ?", "avgRowsRead": 2.5, "totalRowsRead": 9007199254740993,
			"avgRowsWritten": 0, "totalRowsWritten": 0, "avgDurationMs": 0.125, "totalDurationMs": 0.5,
			"numberOfTimesRun": 4, "maxDurationMs": 0.25, "numberOfErrors": 1}})
	}))
	t.Cleanup(srv.Close)
	c := &Client{BaseURL: srv.URL, Token: "tok", AccountID: "acct"}
	ctx := context.Background()

	var raw json.RawMessage
	res, err := c.Insights(ctx, dbID, InsightsOptions{}, &raw)
	require.NoError(t, err)
	assert.Equal(t, "GET /client/v4/accounts/acct/d1/database/"+dbID+"/insights", paths[0])
	assert.Empty(t, got[0], "zero options send no parameters: the edge's defaults apply")
	assert.Equal(t, []QueryInsight{{Query: "SELECT ?", AvgRowsRead: 2.5, TotalRowsRead: 9007199254740993,
		AvgDurationMs: 0.125, TotalDurationMs: 0.5, NumberOfTimesRun: 4, MaxDurationMs: 0.25, NumberOfErrors: 1}}, res,
		"totals above 2^53 are exact")
	assert.Contains(t, string(raw), `"query":"SELECT ?"`)

	_, err = c.Insights(ctx, dbID, InsightsOptions{TimePeriod: "7d", SortBy: "reads", SortType: "avg", Limit: 20}, nil)
	require.NoError(t, err)
	assert.Equal(t, url.Values{"timePeriod": {"7d"}, "sortBy": {"reads"}, "sortType": {"avg"}, "limit": {"20"}}, got[1])

	down = true
	_, err = c.Insights(ctx, dbID, InsightsOptions{}, nil)
	var ae *APIError
	require.True(t, errors.As(err, &ae), "%v", err)
	assert.Equal(t, 7503, ae.Code)
	assert.True(t, errors.Is(err, ErrUnavailable))
}
