package edge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	v4 "github.com/shoaldb/shoal/internal/v4"
)

// GET /client/v4/accounts/{account_id}/d1/database/{database_id}/insights:
// a Shoal extension (D1 answers this question only through its GraphQL
// Analytics API) returning what `wrangler d1 insights` prints, read from
// Options.Insights.

// Insights request limits and defaults (wrangler d1 insights' options).
const (
	insightsDefaultLimit = 5
	insightsMaxLimit     = 1000
	insightsMaxPeriod    = 31 * 24 * time.Hour // D1 keeps analytics for 31 days
	// insightsTimeout bounds one read of the source, so an analytics store
	// that accepts connections but does not answer costs a request at most
	// this long.
	insightsTimeout = 10 * time.Second
	// Retry-After for an unreachable store, and for an edge without one
	// (only a restart with a source configured changes that).
	insightsRetryDown       = 5 * time.Second
	insightsRetryNoSource   = 60 * time.Second
	insightsUnavailableText = "Query insights are temporarily unavailable: the analytics store could not be reached; please retry"
	insightsNoSourceText    = "Query insights are unavailable: this edge has no analytics store configured"
)

// insightsQuery is a validated insights request.
type insightsQuery struct {
	period time.Duration
	order  ShapeOrder
	limit  int
}

// insightsParams are the accepted query parameters; any other is refused,
// so a misspelt option never silently answers a different question.
var insightsParams = []string{"timePeriod", "sortBy", "sortType", "sortDirection", "limit"}

// parseInsightsQuery validates the query string. Defaults: timePeriod=1d,
// sortBy=time, sortType=sum, sortDirection=DESC, limit=5.
func parseInsightsQuery(q url.Values) (insightsQuery, error) {
	for k, vs := range q {
		known := false
		for _, p := range insightsParams {
			known = known || k == p
		}
		if !known {
			return insightsQuery{}, invalid("Invalid property: %s => unknown parameter (accepted: %s)", k, strings.Join(insightsParams, ", "))
		}
		if len(vs) > 1 {
			return insightsQuery{}, invalid("Invalid property: %s => given more than once", k)
		}
	}
	iq := insightsQuery{period: 24 * time.Hour, limit: insightsDefaultLimit}
	if v := q.Get("timePeriod"); v != "" {
		d, ok := parsePeriod(v)
		if !ok {
			return insightsQuery{}, invalid("Invalid property: timePeriod => must be a positive whole number of minutes, hours or days (e.g. 30m, 12h, 7d), at most 31 days")
		}
		iq.period = d
	}
	sortBy, sortType := "time", "sum"
	if v := q.Get("sortBy"); v != "" {
		sortBy = v
	}
	if v := q.Get("sortType"); v != "" {
		sortType = v
	}
	if sortType != "sum" && sortType != "avg" {
		return insightsQuery{}, invalid("Invalid property: sortType => must be sum or avg")
	}
	avg := sortType == "avg"
	switch sortBy {
	case "time":
		iq.order = pick(avg, ShapeByAvgDuration, ShapeByDuration)
	case "reads":
		iq.order = pick(avg, ShapeByAvgRowsRead, ShapeByRowsRead)
	case "writes":
		iq.order = pick(avg, ShapeByAvgRowsWritten, ShapeByRowsWritten)
	case "count":
		iq.order = ShapeByCount // a count has no average (wrangler ignores sortType too)
	default:
		return insightsQuery{}, invalid("Invalid property: sortBy => must be one of time, reads, writes, count")
	}
	if v := q.Get("sortDirection"); v != "" && v != "DESC" {
		return insightsQuery{}, invalid("Invalid property: sortDirection => only DESC is supported")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > insightsMaxLimit {
			return insightsQuery{}, invalid("Invalid property: limit => must be an integer from 1 to %d", insightsMaxLimit)
		}
		iq.limit = n
	}
	return iq, nil
}

func pick(cond bool, a, b ShapeOrder) ShapeOrder {
	if cond {
		return a
	}
	return b
}

// parsePeriod reads wrangler's --timePeriod: digits then m, h or d, more
// than zero and at most 31 days.
func parsePeriod(s string) (time.Duration, bool) {
	if len(s) < 2 || len(s) > 12 {
		return 0, false
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 'm':
		unit = time.Minute
	case 'h':
		unit = time.Hour
	case 'd':
		unit = 24 * time.Hour
	default:
		return 0, false
	}
	digits := s[:len(s)-1]
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false // no sign, space, or fraction
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 1 || n > int64(insightsMaxPeriod/unit) {
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// queryInsightJSON is one shape in the answer: the fields `wrangler d1
// insights` prints, in its order (queryEfficiency, rows returned / rows
// read, is left out: Shoal does not record rows returned, and a made-up 0
// would read as data), then Shoal's additions.
type queryInsightJSON struct {
	Query            string  `json:"query"`
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

func insightJSON(s QueryShape) queryInsightJSON {
	per := func(v float64) float64 {
		if s.Queries <= 0 {
			return 0 // no queries, no average (and never NaN, which JSON cannot carry)
		}
		return v / float64(s.Queries)
	}
	total := float64(s.DurationUs) / 1000
	return queryInsightJSON{
		Query:            s.Text,
		AvgRowsRead:      per(float64(s.RowsRead)),
		TotalRowsRead:    s.RowsRead,
		AvgRowsWritten:   per(float64(s.RowsWritten)),
		TotalRowsWritten: s.RowsWritten,
		AvgDurationMs:    per(total),
		TotalDurationMs:  total,
		NumberOfTimesRun: s.Queries,
		MaxDurationMs:    float64(s.MaxDurationUs) / 1000,
		NumberOfErrors:   s.Errors,
	}
}

// Errors of the insights read, both answered 503 with Retry-After: the
// generic catalog/host message would hide that only analytics are down.
var (
	errNoInsightsSource    = errors.New("no insights source configured")
	errInsightsUnavailable = errors.New("insights source unavailable")
)

func (s *Server) handleInsights(w http.ResponseWriter, r *http.Request, _ principal) {
	shapes, err := s.insights(r)
	switch {
	case err == nil:
		out := make([]queryInsightJSON, len(shapes))
		for i := range shapes {
			out[i] = insightJSON(shapes[i])
		}
		v4.WriteResult(w, out)
	case errors.Is(err, errNoInsightsSource):
		noteReason(w, err)
		v4.WriteRetryAfter(w, http.StatusServiceUnavailable, v4.CodeUnavailable, insightsNoSourceText, insightsRetryNoSource)
	case errors.Is(err, errInsightsUnavailable):
		noteReason(w, err)
		v4.WriteRetryAfter(w, http.StatusServiceUnavailable, v4.CodeUnavailable, insightsUnavailableText, insightsRetryDown)
	default:
		s.writeErr(w, r, err)
	}
}

// insights validates the request (path, rate limits, parameters, before
// any work), then reads the source.
func (s *Server) insights(r *http.Request) ([]QueryShape, error) {
	acct, id, err := s.databaseRequest(r)
	if err != nil {
		return nil, err
	}
	iq, err := parseInsightsQuery(r.URL.Query())
	if err != nil {
		return nil, err
	}
	return s.topShapes(r.Context(), acct, id, iq)
}

// topShapes answers a validated request: the database must be an active
// one of acct (resolved like the query path: the route cache, else a
// bounded catalog read, else while the catalog is unavailable the object
// hosts; another account's database is "not found"), then
// one bounded read of the source. Any source failure is
// errInsightsUnavailable; no source at all is errNoInsightsSource.
func (s *Server) topShapes(ctx context.Context, acct, id string, iq insightsQuery) ([]QueryShape, error) {
	if s.o.Insights == nil {
		return nil, errNoInsightsSource
	}
	if _, err := s.objectRoute(ctx, id, acct); err != nil {
		return nil, err
	}
	since := s.o.Now().Add(-iq.period)
	sctx, cancel := context.WithTimeout(ctx, insightsTimeout)
	defer cancel()
	shapes, err := s.o.Insights.TopShapes(sctx, acct, id, since, iq.order, iq.limit)
	if err != nil {
		// The request's access log line carries err (a 5xx's reason).
		return nil, fmt.Errorf("%w: %w", errInsightsUnavailable, err)
	}
	if len(shapes) > iq.limit {
		shapes = shapes[:iq.limit]
	}
	return shapes, nil
}
