package d1client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
)

// InsightsOptions are the options of Insights, wrangler d1 insights'
// flags. Zero values leave the edge's defaults: TimePeriod "1d", SortBy
// "time", SortType "sum", Limit 5.
type InsightsOptions struct {
	TimePeriod string // e.g. "30m", "12h", "7d"; at most 31 days
	SortBy     string // time, reads, writes or count
	SortType   string // sum or avg (count ignores it)
	Limit      int    // 1..1000
}

// QueryInsight is one query shape's usage over the period: the fields
// `wrangler d1 insights` prints (not queryEfficiency, which needs rows
// returned and Shoal does not record them), plus Shoal's maxDurationMs and
// numberOfErrors.
type QueryInsight struct {
	Query            string  `json:"query"` // the normalised statement; "" if its text was not stored
	AvgRowsRead      float64 `json:"avgRowsRead"`
	TotalRowsRead    int64   `json:"totalRowsRead"`
	AvgRowsWritten   float64 `json:"avgRowsWritten"`
	TotalRowsWritten int64   `json:"totalRowsWritten"`
	AvgDurationMs    float64 `json:"avgDurationMs"`
	TotalDurationMs  float64 `json:"totalDurationMs"`
	NumberOfTimesRun int64   `json:"numberOfTimesRun"`
	MaxDurationMs    float64 `json:"maxDurationMs"`
	NumberOfErrors   int64   `json:"numberOfErrors"`
}

// Insights returns a database's top query shapes
// (GET …/database/{uuid}/insights, a Shoal extension of the D1 API: D1
// itself answers through its GraphQL Analytics API); raw receives the
// API's result. An edge without analytics, or whose analytics store is
// down, answers 503: an *APIError matching ErrUnavailable.
func (c *Client) Insights(ctx context.Context, uuid string, o InsightsOptions, raw *json.RawMessage) ([]QueryInsight, error) {
	q := url.Values{}
	if o.TimePeriod != "" {
		q.Set("timePeriod", o.TimePeriod)
	}
	if o.SortBy != "" {
		q.Set("sortBy", o.SortBy)
	}
	if o.SortType != "" {
		q.Set("sortType", o.SortType)
	}
	if o.Limit != 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	u := c.dbURL(uuid, "insights")
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var out []QueryInsight
	if _, err := c.do(ctx, http.MethodGet, u, nil, &out, raw); err != nil {
		return nil, err
	}
	if out == nil {
		out = []QueryInsight{}
	}
	return out, nil
}
