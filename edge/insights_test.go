package edge

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// insightsCall is one TopShapes call a fakeInsights received.
type insightsCall struct {
	account, database string
	since             time.Time
	order             ShapeOrder
	limit             int
	hasDeadline       bool
}

// fakeInsights records every call and answers with shapes or err.
type fakeInsights struct {
	mu     sync.Mutex
	calls  []insightsCall
	shapes []QueryShape
	err    error
}

func (f *fakeInsights) TopShapes(ctx context.Context, account, database string, since time.Time, order ShapeOrder, limit int) ([]QueryShape, error) {
	_, dl := ctx.Deadline()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, insightsCall{account, database, since, order, limit, dl})
	if f.err != nil {
		return nil, f.err
	}
	return append([]QueryShape(nil), f.shapes...), nil
}

func (f *fakeInsights) taken() []insightsCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.calls
	f.calls = nil
	return out
}

func newInsightsEnv(t *testing.T) (*env, *fakeInsights) {
	src := &fakeInsights{}
	return newEnv(t, func(o *Options) { o.Insights = src }), src
}

func insightsPath(acct, db, query string) string {
	p := dbPath(acct) + "/" + db + "/insights"
	if query != "" {
		p += "?" + query
	}
	return p
}

// insightRow is the answer's JSON, decoded with every field required to
// exist (a missing key must fail the test, not read as 0).
func insightRows(t *testing.T, a answer) []map[string]any {
	t.Helper()
	require.Equal(t, 200, a.Status, "%s", a.Raw)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(a.Result, &rows))
	require.NotNil(t, rows, "an empty answer is [], not null: %s", a.Raw)
	return rows
}

func TestInsightsFiguresAndDefaults(t *testing.T) {
	e, src := newInsightsEnv(t)
	d := e.create(acctA, tokA, "stats")
	src.shapes = []QueryShape{
		{Hash: 7, Text: "SELECT * FROM t WHERE id = ?", Queries: 4, Errors: 1, RowsRead: 10, RowsWritten: 0, DurationUs: 2500, MaxDurationUs: 1200},
		{Hash: 3, Text: "INSERT INTO t VALUES (?)", Queries: 3, RowsRead: 0, RowsWritten: 6, DurationUs: 900, MaxDurationUs: 400},
	}
	a := e.call("GET", insightsPath(acctA, d.UUID, ""), tokA, nil)
	rows := insightRows(t, a)
	require.Len(t, rows, 2)
	assert.Equal(t, map[string]any{
		"query": "SELECT * FROM t WHERE id = ?", "numberOfTimesRun": 4.0, "numberOfErrors": 1.0,
		"totalRowsRead": 10.0, "avgRowsRead": 2.5, "totalRowsWritten": 0.0, "avgRowsWritten": 0.0,
		"totalDurationMs": 2.5, "avgDurationMs": 0.625, "maxDurationMs": 1.2,
	}, rows[0])
	assert.Equal(t, "INSERT INTO t VALUES (?)", rows[1]["query"], "the source's order is kept")
	assert.Equal(t, 2.0, rows[1]["avgRowsWritten"])
	assert.Equal(t, 0.3, rows[1]["avgDurationMs"])

	calls := src.taken()
	require.Len(t, calls, 1)
	c := calls[0]
	assert.Equal(t, acctA, c.account)
	assert.Equal(t, d.UUID, c.database)
	assert.Equal(t, e.clock.Now().Add(-24*time.Hour), c.since, "default timePeriod is 1d, from the edge's clock")
	assert.Equal(t, ShapeByDuration, c.order, "default sortBy=time sortType=sum")
	assert.Equal(t, 5, c.limit, "default limit is wrangler's 5")
	assert.True(t, c.hasDeadline, "the source read is bounded")

	// No usage: an empty list, success.
	src.shapes = nil
	rows = insightRows(t, e.call("GET", insightsPath(acctA, d.UUID, ""), tokA, nil))
	assert.Empty(t, rows)
	assert.JSONEq(t, `[]`, string(e.call("GET", insightsPath(acctA, d.UUID, ""), tokA, nil).Result))

	// A shape without queries (never sent by chsink) still encodes: no NaN.
	src.shapes = []QueryShape{{Hash: 1, Text: "SELECT 1"}}
	rows = insightRows(t, e.call("GET", insightsPath(acctA, d.UUID, ""), tokA, nil))
	assert.Equal(t, 0.0, rows[0]["avgDurationMs"])

	// A source answering more than asked is cut to the limit.
	src.shapes = make([]QueryShape, 9)
	for i := range src.shapes {
		src.shapes[i] = QueryShape{Hash: uint64(i), Text: "q", Queries: 1}
	}
	rows = insightRows(t, e.call("GET", insightsPath(acctA, d.UUID, "limit=2"), tokA, nil))
	assert.Len(t, rows, 2)

	// The UUID is taken in any case and passed on canonical.
	src.taken()
	insightRows(t, e.call("GET", insightsPath(acctA, strings.ToUpper(d.UUID), ""), tokA, nil))
	assert.Equal(t, d.UUID, src.taken()[0].database)
}

func TestInsightsParams(t *testing.T) {
	e, src := newInsightsEnv(t)
	d := e.create(acctA, tokA, "params")
	now := e.clock.Now()
	for _, tc := range []struct {
		query string
		since time.Time
		order ShapeOrder
		limit int
	}{
		{"timePeriod=7d", now.Add(-7 * 24 * time.Hour), ShapeByDuration, 5},
		{"timePeriod=31d", now.Add(-31 * 24 * time.Hour), ShapeByDuration, 5},
		{"timePeriod=744h", now.Add(-744 * time.Hour), ShapeByDuration, 5},
		{"timePeriod=44640m", now.Add(-44640 * time.Minute), ShapeByDuration, 5},
		{"timePeriod=30m", now.Add(-30 * time.Minute), ShapeByDuration, 5},
		{"timePeriod=012h", now.Add(-12 * time.Hour), ShapeByDuration, 5},
		{"sortBy=time&sortType=avg", now.Add(-24 * time.Hour), ShapeByAvgDuration, 5},
		{"sortBy=reads", now.Add(-24 * time.Hour), ShapeByRowsRead, 5},
		{"sortBy=reads&sortType=avg", now.Add(-24 * time.Hour), ShapeByAvgRowsRead, 5},
		{"sortBy=writes&sortType=sum", now.Add(-24 * time.Hour), ShapeByRowsWritten, 5},
		{"sortBy=writes&sortType=avg", now.Add(-24 * time.Hour), ShapeByAvgRowsWritten, 5},
		{"sortBy=count", now.Add(-24 * time.Hour), ShapeByCount, 5},
		{"sortBy=count&sortType=avg", now.Add(-24 * time.Hour), ShapeByCount, 5},
		{"sortDirection=DESC&limit=1", now.Add(-24 * time.Hour), ShapeByDuration, 1},
		{"limit=1000&timePeriod=2d&sortBy=reads&sortType=avg", now.Add(-48 * time.Hour), ShapeByAvgRowsRead, 1000},
	} {
		a := e.call("GET", insightsPath(acctA, d.UUID, tc.query), tokA, nil)
		insightRows(t, a)
		calls := src.taken()
		require.Len(t, calls, 1, tc.query)
		assert.Equal(t, tc.since, calls[0].since, tc.query)
		assert.Equal(t, tc.order, calls[0].order, "%s: %v", tc.query, calls[0].order)
		assert.Equal(t, tc.limit, calls[0].limit, tc.query)
	}

	for _, tc := range []struct{ query, field string }{
		{"timePeriod=32d", "timePeriod"},
		{"timePeriod=745h", "timePeriod"},
		{"timePeriod=44641m", "timePeriod"},
		{"timePeriod=0d", "timePeriod"},
		{"timePeriod=-1d", "timePeriod"},
		{"timePeriod=1w", "timePeriod"},
		{"timePeriod=1", "timePeriod"},
		{"timePeriod=d", "timePeriod"},
		{"timePeriod=1.5d", "timePeriod"},
		{"timePeriod=+1d", "timePeriod"},
		{"timePeriod=99999999999999999d", "timePeriod"},
		{"sortBy=rows", "sortBy"},
		{"sortBy=TIME", "sortBy"},
		{"sortType=max", "sortType"},
		{"sortDirection=ASC", "sortDirection"},
		{"limit=0", "limit"},
		{"limit=-3", "limit"},
		{"limit=1001", "limit"},
		{"limit=five", "limit"},
		{"sort_by=reads", "sort_by"},
		{"limit=1&limit=2", "limit"},
	} {
		a := e.call("GET", insightsPath(acctA, d.UUID, tc.query), tokA, nil)
		assert.Equal(t, 400, a.Status, "%s: %s", tc.query, a.Raw)
		assert.Equal(t, 7400, a.code(), tc.query)
		if len(a.Errors) > 0 {
			assert.True(t, strings.HasPrefix(a.Errors[0].Message, "Invalid property: "+tc.field+" =>"), "%s: %s", tc.query, a.Errors[0].Message)
		}
	}
	assert.Empty(t, src.taken(), "a refused request never reaches the source")

	// An empty value means the default (like the list's page=).
	insightRows(t, e.call("GET", insightsPath(acctA, d.UUID, "timePeriod=&sortBy=&sortType=&sortDirection=&limit="), tokA, nil))
	calls := src.taken()
	require.Len(t, calls, 1)
	assert.Equal(t, insightsCall{acctA, d.UUID, now.Add(-24 * time.Hour), ShapeByDuration, 5, true}, calls[0])

	a := e.call("GET", insightsPath(acctA, "not-a-uuid", ""), tokA, nil)
	assert.Equal(t, 400, a.Status)
	assert.Equal(t, 7400, a.code())
	a = e.call("POST", insightsPath(acctA, d.UUID, ""), tokA, nil)
	assert.Equal(t, 405, a.Status)
	assert.Empty(t, src.taken())
}

func TestInsightsAccountScoping(t *testing.T) {
	e, src := newInsightsEnv(t)
	mine := e.create(acctA, tokA, "mine")
	theirs := e.create(acctB, tokB, "theirs")

	// Another account's token on this account's path: 403.
	a := e.call("GET", insightsPath(acctA, mine.UUID, ""), tokB, nil)
	assert.Equal(t, 403, a.Status, "%s", a.Raw)
	assert.Equal(t, 7403, a.code())
	// Its own path, this account's database: indistinguishable from missing.
	a = e.call("GET", insightsPath(acctB, mine.UUID, ""), tokB, nil)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	assert.Equal(t, 7404, a.code())
	a = e.call("GET", insightsPath(acctA, theirs.UUID, ""), tokA, nil)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	// No token, a wrong token.
	a = e.call("GET", insightsPath(acctA, mine.UUID, ""), "", nil)
	assert.Equal(t, 401, a.Status)
	assert.Equal(t, 10000, a.code())
	a = e.call("GET", insightsPath(acctA, mine.UUID, ""), "nope", nil)
	assert.Equal(t, 401, a.Status)
	// A database that never existed.
	a = e.call("GET", insightsPath(acctA, "0195f1a2-0000-7000-8000-000000000000", ""), tokA, nil)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	assert.Empty(t, src.taken(), "nothing above may reach the source")

	// A deleted database is not found either, through the cache and after.
	gone := e.create(acctA, tokA, "gone")
	require.Equal(t, 200, e.call("DELETE", dbPath(acctA)+"/"+gone.UUID, tokA, nil).Status)
	a = e.call("GET", insightsPath(acctA, gone.UUID, ""), tokA, nil)
	assert.Equal(t, 404, a.Status, "%s", a.Raw)
	assert.Empty(t, src.taken())

	// The owner, and the operator's admin token, get through, each with
	// the path's account.
	insightRows(t, e.call("GET", insightsPath(acctA, mine.UUID, ""), tokA, nil))
	insightRows(t, e.call("GET", insightsPath(acctB, theirs.UUID, ""), adminTok, nil))
	calls := src.taken()
	require.Len(t, calls, 2)
	assert.Equal(t, [2]string{acctA, mine.UUID}, [2]string{calls[0].account, calls[0].database})
	assert.Equal(t, [2]string{acctB, theirs.UUID}, [2]string{calls[1].account, calls[1].database})
}

func TestInsightsUnavailable(t *testing.T) {
	e, src := newInsightsEnv(t)
	d := e.create(acctA, tokA, "down")
	src.err = errors.New("dial tcp 127.0.0.1:9000: connect: connection refused")
	a := e.call("GET", insightsPath(acctA, d.UUID, ""), tokA, nil)
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.code())
	assert.Equal(t, "5", a.Header.Get("Retry-After"))
	assert.False(t, a.Success)
	assert.Equal(t, "null", string(a.Result), "no figures on failure")
	require.Len(t, a.Errors, 1)
	assert.Contains(t, a.Errors[0].Message, "analytics store could not be reached")
	assert.NotContains(t, a.Errors[0].Message, "127.0.0.1", "internals never reach the client")
	// Bad input is still a 400 while the store is down, and checked first.
	a = e.call("GET", insightsPath(acctA, d.UUID, "limit=0"), tokA, nil)
	assert.Equal(t, 400, a.Status)
	// Recovery needs nothing but the store.
	src.err = nil
	insightRows(t, e.call("GET", insightsPath(acctA, d.UUID, ""), tokA, nil))

	// A deadline expiring in the source is unavailability too.
	src.err = context.DeadlineExceeded
	a = e.call("GET", insightsPath(acctA, d.UUID, ""), tokA, nil)
	assert.Equal(t, 503, a.Status)
	assert.Contains(t, a.Errors[0].Message, "analytics")

	// An edge without a source.
	e2 := newEnv(t)
	d2 := e2.create(acctA, tokA, "nosrc")
	a = e2.call("GET", insightsPath(acctA, d2.UUID, ""), tokA, nil)
	assert.Equal(t, 503, a.Status, "%s", a.Raw)
	assert.Equal(t, 7503, a.code())
	assert.Equal(t, "60", a.Header.Get("Retry-After"))
	assert.Contains(t, a.Errors[0].Message, "no analytics store configured")
	assert.Equal(t, "null", string(a.Result))
	// Auth still comes first.
	a = e2.call("GET", insightsPath(acctA, d2.UUID, ""), tokB, nil)
	assert.Equal(t, 403, a.Status)
}

func TestParsePeriod(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"1m": time.Minute, "90m": 90 * time.Minute, "1h": time.Hour, "1d": 24 * time.Hour, "31d": 31 * 24 * time.Hour,
	} {
		got, ok := parsePeriod(s)
		assert.True(t, ok, s)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "m", "0m", "32d", "1 d", " 1d", "1d ", "1D", "1s", "1dd", "0x1d", "١d", "9223372036854775807m"} {
		_, ok := parsePeriod(s)
		assert.False(t, ok, "%q", s)
	}
}

func TestInsightJSONNoNaN(t *testing.T) {
	for _, s := range []QueryShape{{}, {Queries: 0, RowsRead: 5, DurationUs: 7}, {Queries: math.MaxInt64, DurationUs: math.MaxInt64}} {
		_, err := json.Marshal(insightJSON(s))
		assert.NoError(t, err, "%+v", s)
	}
	// Parameters are parsed as url.Values: a raw '+' is a space, refused.
	_, err := parseInsightsQuery(url.Values{"timePeriod": {" 1d"}})
	assert.Error(t, err)
}

// DESIGN.md: package edge imports no ClickHouse driver (edge/chinsights
// does).
func TestEdgeImportsNoClickHouse(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "github.com/shoaldb/shoal/internal/v4")
	assert.NotContains(t, string(out), "ClickHouse")
	assert.NotContains(t, string(out), "shoal/pipeline/chsink")
}
